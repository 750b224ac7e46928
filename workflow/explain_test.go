package workflow_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// The worker's claim reads the partial runnable index, not the finished instances: with 20 000
// completed rows retained and two runnable ones, the plan of the claim's candidate scan uses
// keiro_workflows_runnable_idx.
func TestClaimUsesRunnableIndex(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	_, err := b.db.Pool.Exec(ctx, `INSERT INTO keiro_workflows (workflow_name, workflow_id, status, completed_at)
SELECT 'w', 'done-' || g, 'completed', now() FROM generate_series(1, 20000) g`)
	require.NoError(t, err)
	_, err = b.db.Pool.Exec(ctx, `INSERT INTO keiro_workflows (workflow_name, workflow_id, wake_after)
VALUES ('w', 'live-1', now()), ('w', 'live-2', now())`)
	require.NoError(t, err)
	_, err = b.db.Pool.Exec(ctx, `ANALYZE keiro_workflows`)
	require.NoError(t, err)
	rows, err := b.db.Pool.Query(ctx, `EXPLAIN SELECT workflow_name, workflow_id FROM keiro_workflows
WHERE status IN ('pending', 'running', 'suspended') AND wake_after IS NOT NULL AND wake_after <= now()
  AND (lease_until IS NULL OR lease_until <= now()) AND workflow_name = ANY(ARRAY['w'])
ORDER BY wake_after LIMIT 10 FOR UPDATE SKIP LOCKED`)
	require.NoError(t, err)
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	plan := strings.Join(lines, "\n")
	require.Contains(t, plan, "keiro_workflows_runnable_idx", plan)
}
