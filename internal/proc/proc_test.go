package proc

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestStartLogsAndReportsTheExit(t *testing.T) {
	log := filepath.Join(t.TempDir(), "out.log")
	p, err := Start(log, t.TempDir(), "/bin/sh", []string{"-c", "pwd >/dev/null; echo started; echo oops >&2; exit 3"})
	if err != nil {
		t.Fatal(err)
	}
	<-p.Done()
	var ee *exec.ExitError
	if !errors.As(p.Err(), &ee) || ee.ExitCode() != 3 || !p.Exited() {
		t.Fatalf("Err = %v, Exited = %v; want exit status 3", p.Err(), p.Exited())
	}
	b, err := os.ReadFile(log)
	if err != nil || string(b) != "started\noops\n" {
		t.Fatalf("log %q (%v)", b, err)
	}
	if err := p.Signal(syscall.SIGKILL); err != nil {
		t.Fatalf("signalling an exited process: %v", err)
	}
}

func TestSignalEndsTheProcess(t *testing.T) {
	p, err := Start(filepath.Join(t.TempDir(), "out.log"), "", "/bin/sleep", []string{"60"})
	if err != nil {
		t.Fatal(err)
	}
	if p.Exited() {
		t.Fatal("exited at once")
	}
	if err := p.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-p.Done()
	if p.Err() == nil {
		t.Fatal("a killed process exited cleanly")
	}
}

func TestStartFailsForAMissingProgram(t *testing.T) {
	if _, err := Start(filepath.Join(t.TempDir(), "out.log"), "", filepath.Join(t.TempDir(), "nope"), nil); err == nil {
		t.Fatal("started a program that does not exist")
	}
}

func TestFreePortsAndTail(t *testing.T) {
	ports, err := FreePorts(5)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for _, p := range ports {
		if p <= 0 || seen[p] {
			t.Fatalf("ports %v", ports)
		}
		seen[p] = true
	}
	if got := Tail("a\nb\nc\n", 2); got != "b\nc" {
		t.Fatalf("Tail = %q", got)
	}
	if got := Tail("a", 5); got != "a" {
		t.Fatalf("Tail = %q", got)
	}
}
