package outbox_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/keiro-go/keiro"
	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/outbox"
)

// recordingHandler keeps every record logged through it.
type recordingHandler struct {
	mu      sync.Mutex
	records []slog.Record
}

func (h *recordingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *recordingHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.records = append(h.records, r.Clone())
	return nil
}
func (h *recordingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *recordingHandler) WithGroup(string) slog.Handler      { return h }

// find returns the attributes of the records whose message starts with prefix.
func (h *recordingHandler) find(prefix string) []map[string]string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []map[string]string
	for _, r := range h.records {
		if !strings.HasPrefix(r.Message, prefix) {
			continue
		}
		m := map[string]string{"level": r.Level.String()}
		r.Attrs(func(a slog.Attr) bool { m[a.Key] = a.Value.String(); return true })
		out = append(out, m)
	}
	return out
}

// The relay logs each row it retries (warn), kills (error) and rejects (error), with the row's
// ids, key, destination and error.
func TestRelayLogsRowTransitions(t *testing.T) {
	t.Parallel()
	db, kc, st := rig(t, 1)
	f := injectFaults(kc)
	f.set(func(f *faults) { f.all, f.code = true, kerr.UnknownServerError.Code })
	res := enqueue(t, db.Pool, st,
		event("big-1", "orders", ptr("B"), `{"pad":"`+strings.Repeat("x", 2000)+`"}`),
		event("a-1", "orders", ptr("A"), `{"i":1}`))
	rec := &recordingHandler{}
	p := new(testenv.Progress)
	startRelay(t, db, kc, outbox.RelayConfig{MaxAttempts: 2, MaxInFlightBatches: 1, ClaimConcurrency: 1, MaxRecordBytes: 1000,
		Backoff: keiro.Backoff{Initial: time.Millisecond, Max: 5 * time.Millisecond}, PollInterval: 10 * time.Millisecond,
		Logger: slog.New(rec), OnBatch: onSettled(p)})
	p.Wait(t, 2, 30*time.Second, nil)

	rejected := rec.find("outbox row rejected")
	require.Len(t, rejected, 1)
	require.Equal(t, "ERROR", rejected[0]["level"])
	require.Equal(t, res[0].OutboxID.String(), rejected[0]["outbox_id"])
	require.Equal(t, "big-1", rejected[0]["message_id"])
	require.Equal(t, "B", rejected[0]["key"])
	require.Equal(t, "orders", rejected[0]["destination"])
	require.Equal(t, "message_too_large", rejected[0]["code"])
	require.NotEmpty(t, rejected[0]["err"])

	retried := rec.find("outbox row failed; it will be retried")
	require.Len(t, retried, 1)
	require.Equal(t, "WARN", retried[0]["level"])
	require.Equal(t, "a-1", retried[0]["message_id"])
	require.Equal(t, "A", retried[0]["key"])
	require.Contains(t, retried[0]["err"], "UNKNOWN_SERVER_ERROR")
	require.NotEmpty(t, retried[0]["retry_in"])

	dead := rec.find("outbox row is dead")
	require.Len(t, dead, 1)
	require.Equal(t, "ERROR", dead[0]["level"])
	require.Equal(t, res[1].OutboxID.String(), dead[0]["outbox_id"])
	require.Equal(t, "orders", dead[0]["destination"])
	require.Equal(t, "2", dead[0]["attempt"])
	require.Contains(t, dead[0]["err"], "UNKNOWN_SERVER_ERROR")
}
