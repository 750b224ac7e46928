package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/keiro-go/keiro/keirotest/testenv"
)

// Paths of the binaries TestMain builds.
var relayBin, consumerBin string

func TestMain(m *testing.M) {
	code := func() int {
		dir, err := os.MkdirTemp("", "keiro-e2e-bin-")
		if err != nil {
			fmt.Fprintln(os.Stderr, "e2e: temp dir:", err)
			return 1
		}
		defer os.RemoveAll(dir)
		root, err := moduleRoot()
		if err != nil {
			fmt.Fprintln(os.Stderr, "e2e:", err)
			return 1
		}
		build := exec.Command("go", "build", "-o", dir+string(os.PathSeparator), "./cmd/relay", "./cmd/consumer")
		build.Dir = root
		if out, err := build.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "e2e: build the binaries: %v\n%s", err, out)
			return 1
		}
		relayBin, consumerBin = filepath.Join(dir, "relay"), filepath.Join(dir, "consumer")
		return testenv.Run(m)
	}()
	os.Exit(code)
}

func moduleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("find the module root: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", fmt.Errorf("not inside the keiro module")
	}
	return filepath.Dir(gomod), nil
}
