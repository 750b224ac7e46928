package outbox

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/outbox/internal/claimsql"
	"github.com/keiro-go/keiro/tracing"
)

// counterTotal is the sum of the int64 counter name's data points (0 when it has none).
func counterTotal(t *testing.T, reader *sdkmetric.ManualReader, name string) int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	var n int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			sum, ok := m.Data.(metricdata.Sum[int64])
			require.True(t, ok, "%s is %T", name, m.Data)
			for _, dp := range sum.DataPoints {
				n += dp.Value
			}
		}
	}
	return n
}

// TestMarkRolledBackAfterItsRowsWereReadCountsNothing: a mark whose statement returned its rows
// and then failed (a deferred trigger refuses the third row at commit) wrote nothing. The relay
// must not count, log or report the transitions it read from it: the batch's result, Stats, the
// metrics and the transition log stay as if nothing moved, and the mark is given up as any
// refused mark is. Once the refusal is gone the rows come back through their lease and are
// marked, and counted, once.
func TestMarkRolledBackAfterItsRowsWereReadCountsNothing(t *testing.T) {
	t.Parallel()
	db, st := setup(t, ev("a1", k("A")), ev("b1", k("B")), ev("c1", k("C")))
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `
CREATE FUNCTION refuse_c1() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'mark of c1 refused at commit for the test' USING ERRCODE = '22023'; END $$;
CREATE CONSTRAINT TRIGGER refuse_c1 AFTER UPDATE ON keiro_outbox DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
    WHEN (NEW.message_id = 'c1' AND OLD.status = 'publishing' AND NEW.status <> 'publishing')
    EXECUTE FUNCTION refuse_c1();`)
	require.NoError(t, err)

	logs := &testenv.LogBuffer{}
	reader := sdkmetric.NewManualReader()
	var onBatch []BatchResult
	kc := testenv.NewKafka(t)
	r, err := NewRelay(db.Pool, kc.NewClient(t, ProducerOpts()...), RelayConfig{Schema: db.Schema,
		Logger:        slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)),
		OnBatch:       func(res BatchResult) { onBatch = append(onBatch, res) }})
	require.NoError(t, err)

	// Sent, retried, rejected: one of each transition the relay counts and logs.
	results := []produceResult{
		{done: true, partition: 0, offset: 7},
		{done: true, err: errors.New("boom")},
		{done: true, err: kerr.MessageTooLarge},
	}
	token, rows, err := claimsOf(st).Claim(ctx, db.Pool, PerKeyHeadOfLine, 10, time.Minute, 10, nil, 0)
	require.NoError(t, err)
	require.Equal(t, []string{"a1", "b1", "c1"}, ids(rows))

	// The premise: the mark statement hands its rows over before its commit fails.
	ms := []claimsql.Mark{{ID: rows[0].ID, Outcome: outcomeSent}, {ID: rows[1].ID, Outcome: outcomeFailed, Err: "boom"},
		{ID: rows[2].ID, Outcome: outcomeRejected, Err: "too large", Code: "message_too_large"}}
	probe, err := db.Pool.Query(ctx, st.q.Mark, [16]byte(token), [][16]byte{ms[0].ID, ms[1].ID, ms[2].ID},
		[]string{"sent", "failed", "rejected"}, []*string{nil, &ms[1].Err, &ms[2].Err}, []int64{0, 0, 0},
		[]int32{0, 0, 0}, []int64{7, 0, 0}, []*string{nil, nil, &ms[2].Code}, 10)
	require.NoError(t, err)
	read := 0
	for probe.Next() {
		read++
	}
	var pe *pgconn.PgError
	require.ErrorAs(t, probe.Err(), &pe)
	require.Equal(t, "22023", pe.Code)
	require.Equal(t, 3, read, "the rolled-back mark returned its rows first")

	res := r.markOutcome(ctx, &claimedBatch{token: token, rows: rows, results: results, leasedAt: time.Now()})
	require.Equal(t, BatchResult{Claimed: 3}, res, "the rolled-back transitions are not reported")
	require.Equal(t, []BatchResult{{Claimed: 3}}, onBatch)
	s := r.Stats()
	require.Zero(t, s.Published)
	require.Zero(t, s.Retried)
	require.Zero(t, s.Rejected)
	require.Zero(t, s.Dead)
	require.EqualValues(t, maxMarkRefusals, s.MarkErrors)
	require.EqualValues(t, 1, s.MarksAbandoned)
	require.Zero(t, counterTotal(t, reader, tracing.MetricOutboxPublished))
	require.Zero(t, counterTotal(t, reader, tracing.MetricOutboxRejected))
	require.Zero(t, counterTotal(t, reader, tracing.MetricOutboxRetried))
	require.NotContains(t, logs.String(), "outbox row failed")
	require.NotContains(t, logs.String(), "outbox row rejected")
	for _, id := range []string{"a1", "b1", "c1"} {
		got, _ := status(t, db, id)
		require.Equal(t, string(StatusPublishing), got, "%s waits for its lease", id)
	}

	// The refusal gone and the lease over, the rows are re-claimed and marked once.
	_, err = db.Pool.Exec(ctx, `DROP TRIGGER refuse_c1 ON keiro_outbox;
UPDATE keiro_outbox SET lease_until = now() - interval '1 second'`)
	require.NoError(t, err)
	token, rows, err = claimsOf(st).Claim(ctx, db.Pool, PerKeyHeadOfLine, 10, time.Minute, 10, nil, 0)
	require.NoError(t, err)
	require.Equal(t, []string{"a1", "b1", "c1"}, ids(rows))
	res = r.markOutcome(ctx, &claimedBatch{token: token, rows: rows, results: results, leasedAt: time.Now()})
	want := BatchResult{Claimed: 3, Reclaimed: 3, Published: 1, Retried: 1, Rejected: 1}
	require.Equal(t, want, res)
	require.Equal(t, []BatchResult{{Claimed: 3}, want}, onBatch)
	s = r.Stats()
	require.EqualValues(t, 1, s.Published)
	require.EqualValues(t, 1, s.Retried)
	require.EqualValues(t, 1, s.Rejected)
	require.EqualValues(t, maxMarkRefusals, s.MarkErrors)
	require.EqualValues(t, 1, counterTotal(t, reader, tracing.MetricOutboxPublished))
	require.EqualValues(t, 1, counterTotal(t, reader, tracing.MetricOutboxRejected))
	require.EqualValues(t, 1, counterTotal(t, reader, tracing.MetricOutboxRetried))
	require.Equal(t, 1, strings.Count(logs.String(), "outbox row failed"))
	require.Equal(t, 1, strings.Count(logs.String(), "outbox row rejected"))
	for id, want := range map[string]string{"a1": string(StatusSent), "b1": string(StatusFailed), "c1": string(StatusRejected)} {
		got, attempts := status(t, db, id)
		require.Equal(t, want, got, id)
		require.Equal(t, 2, attempts, id)
	}
	var off int64
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT kafka_offset FROM keiro_outbox WHERE message_id = 'a1'").Scan(&off))
	require.EqualValues(t, 7, off)
}
