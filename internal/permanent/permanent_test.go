package permanent

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

type own bool

func (o own) Error() string   { return "own" }
func (o own) Permanent() bool { return bool(o) }

func TestWrapAndIs(t *testing.T) {
	base := errors.New("malformed")
	require.Nil(t, Wrap(nil))
	err := Wrap(base)
	require.EqualError(t, err, "permanent: malformed")
	require.ErrorIs(t, err, base)
	require.True(t, Is(err))
	require.True(t, Is(fmt.Errorf("apply: %w", err)))
	require.True(t, Is(fmt.Errorf("apply: %w", own(true))))
	require.False(t, Is(own(false)))
	require.False(t, Is(base))
	require.False(t, Is(nil))
}
