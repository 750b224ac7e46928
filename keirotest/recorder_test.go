package keirotest_test

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
)

// recorder is a testing.TB that records failures instead of reporting them, so the kit's own
// failure messages can be checked. Fatal stops the calling goroutine like testing.T does;
// everything else (Cleanup, Name, ...) goes to the real test.
type recorder struct {
	testing.TB
	mu     sync.Mutex
	failed bool
	msgs   []string
}

func (r *recorder) Helper() {}

func (r *recorder) report(msg string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failed = true
	r.msgs = append(r.msgs, msg)
}

func (r *recorder) Error(args ...any)                 { r.report(fmt.Sprint(args...)) }
func (r *recorder) Errorf(format string, args ...any) { r.report(fmt.Sprintf(format, args...)) }
func (r *recorder) Fatal(args ...any)                 { r.report(fmt.Sprint(args...)); runtime.Goexit() }
func (r *recorder) Fatalf(format string, args ...any) {
	r.report(fmt.Sprintf(format, args...))
	runtime.Goexit()
}
func (r *recorder) FailNow() { r.Fail(); runtime.Goexit() }
func (r *recorder) Fail() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failed = true
}
func (r *recorder) Failed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failed
}

// message returns everything reported.
func (r *recorder) message() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Join(r.msgs, "\n")
}

// record runs fn with a recorder in a goroutine of its own (Fatal ends it) and returns the
// recorder.
func record(t *testing.T, fn func(tb testing.TB)) *recorder {
	t.Helper()
	r := &recorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn(r)
	}()
	<-done
	return r
}

// requireFailure fails t unless r failed with a message containing every one of parts.
func requireFailure(t *testing.T, r *recorder, parts ...string) {
	t.Helper()
	if !r.Failed() {
		t.Fatalf("the assertion passed; want it to fail with a message containing %q", parts)
	}
	msg := r.message()
	for _, p := range parts {
		if !strings.Contains(msg, p) {
			t.Errorf("the failure message lacks %q; it is:\n%s", p, msg)
		}
	}
}

// requirePass fails t if r recorded a failure.
func requirePass(t *testing.T, r *recorder) {
	t.Helper()
	if r.Failed() {
		t.Fatalf("want no failure, got:\n%s", r.message())
	}
}
