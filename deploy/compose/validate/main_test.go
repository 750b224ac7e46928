package validate_test

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/keiro-go/keiro/keirotest/testenv"
)

// TestMain is testenv.Main, plus removing the binaries the stack test built: testenv.Main exits
// the process, so it cannot be followed.
func TestMain(m *testing.M) {
	code := m.Run()
	testenv.StopRealKafka()
	testenv.StopSchemaRegistry()
	if bins.dir != "" {
		_ = os.RemoveAll(bins.dir)
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}
