package inbox_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/events"
	"github.com/keiro-go/keiro/inbox"
)

// ownPermanent is a caller's own permanent error type.
type ownPermanent struct{ permanent bool }

func (e ownPermanent) Error() string   { return "own" }
func (e ownPermanent) Permanent() bool { return e.permanent }

// One permanent marker serves both packages: a handler shared by a consumer and a subscription
// wraps its error once.
func TestIsPermanentAcrossPackages(t *testing.T) {
	base := errors.New("malformed")
	for name, tc := range map[string]struct {
		err  error
		want bool
	}{
		"inbox.Permanent":         {inbox.Permanent(base), true},
		"events.Permanent":        {events.Permanent(base), true},
		"wrapped events marker":   {fmt.Errorf("apply: %w", events.Permanent(base)), true},
		"own marker":              {fmt.Errorf("apply: %w", ownPermanent{true}), true},
		"own marker saying false": {ownPermanent{false}, false},
		"plain":                   {base, false},
		"nil":                     {nil, false},
	} {
		require.Equal(t, tc.want, inbox.IsPermanent(tc.err), name)
		require.Equal(t, tc.want, events.IsPermanent(tc.err), name)
	}
}
