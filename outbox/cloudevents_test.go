package outbox_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/outbox"
)

// toEnvelope converts a consumed record, keeping only the headers keep accepts.
func toEnvelope(rec *kgo.Record, keep func(string) bool) envelope.Record {
	r := envelope.Record{Topic: rec.Topic, Key: rec.Key, Value: rec.Value, Timestamp: rec.Timestamp}
	for _, h := range rec.Headers {
		if keep(h.Key) {
			r.Headers = append(r.Headers, envelope.Header{Key: h.Key, Value: h.Value})
		}
	}
	return r
}

// With CloudEventsDestinations the relay adds the CloudEvents binary-mode headers to the records
// of those topics only; a CloudEvents-only reader (keiro headers stripped) decodes the same event.
func TestRelayEmitsCloudEventsPerDestination(t *testing.T) {
	t.Parallel()
	db, kc, st := rig(t, 1)
	kc.CreateTopic(t, "invoices", 1)
	enqueue(t, db.Pool, st, event("o-1", "orders", ptr("A"), `{"i":1}`), event("i-1", "invoices", ptr("B"), `{"i":2}`))
	p := new(testenv.Progress)
	startRelay(t, db, kc, outbox.RelayConfig{CloudEventsDestinations: []string{"orders"}, PollInterval: 10 * time.Millisecond, OnBatch: onSettled(p), Logger: testLogger(t)})
	p.Wait(t, 2, 30*time.Second, nil)

	recs := kc.ConsumeRecords(t, 2, 30*time.Second, "orders", "invoices")
	require.Len(t, recs, 2)
	for _, rec := range recs {
		ce := map[string]string{}
		for _, h := range rec.Headers {
			if strings.HasPrefix(h.Key, "ce_") {
				ce[h.Key] = string(h.Value)
			}
		}
		all := toEnvelope(rec, func(string) bool { return true })
		ev, err := envelope.Decode(all)
		require.NoError(t, err)
		if rec.Topic == "invoices" {
			require.Empty(t, ce, "invoices is not a CloudEvents destination")
			continue
		}
		require.Equal(t, map[string]string{
			envelope.HeaderCEID: "o-1", envelope.HeaderCESource: "ordering", envelope.HeaderCEType: "OrderPlaced",
			envelope.HeaderCESpecVersion: "1.0", envelope.HeaderCETime: ce[envelope.HeaderCETime], envelope.HeaderCEPartitionKey: "A",
		}, ce)
		ceOnly, err := envelope.Decode(toEnvelope(rec, func(k string) bool { return strings.HasPrefix(k, "ce_") || k == "content-type" }))
		require.NoError(t, err)
		require.Equal(t, ev.MessageID, ceOnly.MessageID)
		require.Equal(t, ev.Source, ceOnly.Source)
		require.Equal(t, ev.EventType, ceOnly.EventType)
		require.True(t, ev.OccurredAt.Equal(ceOnly.OccurredAt))
		require.Equal(t, *ev.Key, *ceOnly.Key)
	}

	_, err := outbox.NewRelay(db.Pool, kc.NewClient(t, outbox.ProducerOpts()...), outbox.RelayConfig{Schema: db.Schema, CloudEventsDestinations: []string{"bad topic"}})
	require.ErrorContains(t, err, `CloudEventsDestinations[0] "bad topic"`)
}
