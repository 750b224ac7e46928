// Package proc runs the servers the test kit and the deployment checks start as child processes
// (the Kafka broker's and the schema registry's JVMs, Jaeger, etcd and kube-apiserver): each
// dies with the process that started it, its output goes to a log file, and its exit can be
// waited for. It finds free loopback ports for them, keeps their downloads and builds in a
// per-machine cache under a lock, and builds the ones written in Go from pinned modules
// (GoBinary).
package proc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"
)

// Process is a child process that gets SIGKILL when the process that started it dies.
type Process struct {
	// Cmd is the started command.
	Cmd *exec.Cmd

	done chan struct{} // closed once the process exited
	err  error         // Wait's result, set before done is closed
}

// Start starts name with args in dir (the current directory when empty), its output appended
// to logPath. The parent-death signal belongs to the OS thread that forks, so that goroutine
// keeps its thread locked for the child's whole life: a test binary that dies, even by a
// timeout's panic, takes its child with it.
func Start(logPath, dir, name string, args []string) (*Process, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	p := &Process{done: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		defer logFile.Close()
		cmd := exec.Command(name, args...)
		cmd.Dir = dir
		cmd.Stdout, cmd.Stderr = logFile, logFile
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		p.Cmd = cmd
		started <- nil
		p.err = cmd.Wait()
		close(p.done)
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return p, nil
}

// Done is closed once the process exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// Err is the process's exit error (nil for a clean exit); meaningful once Done is closed.
func (p *Process) Err() error {
	<-p.done
	return p.err
}

// Exited reports whether the process has exited.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Signal sends sig to the process; a process that already exited is not an error.
func (p *Process) Signal(sig os.Signal) error {
	if err := p.Cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	return nil
}

// FreePorts returns n distinct free loopback ports.
func FreePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			_ = l.Close()
		}
	}()
	out := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("find a free port: %w", err)
		}
		ls = append(ls, l)
		out = append(out, l.Addr().(*net.TCPAddr).Port)
	}
	return out, nil
}

// Tail returns the last n lines of s.
func Tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// WaitReady calls ready every interval until it returns nil, and fails when the process exits
// first or timeout passes; what names the process in the errors, which end with the last lines
// of its log (logTail).
func (p *Process) WaitReady(ctx context.Context, what string, timeout, interval time.Duration, logTail func() string, ready func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		if p.Exited() {
			return fmt.Errorf("%s exited while starting: %w\n%s", what, p.Err(), logTail())
		}
		last := ready(ctx)
		if last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s did not answer within %s: %w\n%s", what, timeout, last, logTail())
		case <-time.After(interval):
		}
	}
}

// Kill sends SIGKILL and waits up to wait for the process to exit.
func (p *Process) Kill(wait time.Duration) {
	if p == nil || p.Cmd == nil {
		return
	}
	_ = p.Signal(syscall.SIGKILL)
	select {
	case <-p.done:
	case <-time.After(wait):
	}
}

// TailFile returns the last n lines of the file at path ("" when it cannot be read).
func TailFile(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return Tail(string(b), n)
}

// LookPath finds a program on PATH, then in the given directories.
func LookPath(name string, dirs ...string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, d := range dirs {
		p := filepath.Join(d, name)
		if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not found on PATH", name)
}
