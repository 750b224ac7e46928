package testenv

import (
	"bytes"
	"sync"
)

// LogBuffer collects what a component logs (an slog handler's writer, a process's output) and
// is safe for the component's goroutines to write while the test reads it. The zero value is
// ready to use.
type LogBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write appends p.
func (b *LogBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns everything written so far.
func (b *LogBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
