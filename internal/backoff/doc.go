// Package backoff waits out a retry delay ([github.com/keiro-go/keiro.Backoff]) unless the
// context ends first.
package backoff
