package browsertest_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

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
