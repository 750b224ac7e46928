package browsertest_test

import (
	"bytes"
	"context"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// syncBuffer is a log sink safe for the server's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// openPool opens a pool on conn, closed when the test ends.
func openPool(t *testing.T, conn string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), conn)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

func ptr[T any](v T) *T { return &v }

// consumerName is the inbox consumer (and consumer group) the console is configured with.
const consumerName = "billing"
