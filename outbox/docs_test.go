package outbox_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestREADMEExample keeps the README's Go example identical to readme_test.go, where it is
// compiled (and Example_service calls it), so that the first code a reader copies cannot rot.
func TestREADMEExample(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join("..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, block, ok := strings.Cut(string(readme), "```go\n")
	if !ok {
		t.Fatal("README.md has no ```go block")
	}
	block, _, _ = strings.Cut(block, "```")
	code, err := os.ReadFile("readme_test.go")
	if err != nil {
		t.Fatal(err)
	}
	_, decls, ok := strings.Cut(string(code), "\n)\n\n") // after the import block
	if !ok {
		t.Fatal("readme_test.go has no import block")
	}
	if block != decls {
		t.Fatalf("README.md's Go example differs from outbox/readme_test.go's declarations: copy them "+
			"into the README (or the README's into the file)\nREADME:\n%s\nreadme_test.go:\n%s", block, decls)
	}
}
