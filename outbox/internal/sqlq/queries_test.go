package sqlq

import "testing"

// Every statement is whole: New panics on a placeholder left unfilled (pgtext.Expand).
func TestNewFillsEveryPlaceholder(t *testing.T) {
	if q := New("keiro"); q.ClaimKey == "" || q.EnqueueMany == "" {
		t.Fatal("statements missing")
	}
}
