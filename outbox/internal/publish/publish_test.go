package publish_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/outbox/internal/publish"
)

// newClient returns a client that never connects (no record is produced).
func newClient(t *testing.T, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	c, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers("127.0.0.1:1")}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(c.Close)
	return c
}

// A client without the relay's producer options is refused, every problem at once.
func TestCheckClientReportsEveryProblem(t *testing.T) {
	_, err := publish.CheckClient(nil, 1, 0)
	require.ErrorContains(t, err, "client is nil")
	c := newClient(t, kgo.RequiredAcks(kgo.LeaderAck()), kgo.DisableIdempotentWrite(),
		kgo.MaxBufferedRecords(10), kgo.MaxBufferedBytes(1<<20))
	_, err = publish.CheckClient(c, 100, 0)
	for _, want := range []string{"RequiredAcks must be AllISRAcks", "idempotent writes are disabled",
		"ManualFlushing is required", "MaxBufferedRecords (10) must be at least", "MaxBufferedBytes (1048576) must not be set"} {
		require.ErrorContains(t, err, want)
	}
}

// The largest record is the configured one, lowered to the client's ProducerBatchMaxBytes,
// and franz-go's default when neither is set.
func TestCheckClientMaxRecord(t *testing.T) {
	opts := []kgo.Opt{kgo.RequiredAcks(kgo.AllISRAcks()), kgo.ManualFlushing()}
	max, err := publish.CheckClient(newClient(t, opts...), 1, 0)
	require.NoError(t, err)
	require.Equal(t, publish.DefaultMaxRecordBytes, max)
	max, err = publish.CheckClient(newClient(t, append(opts, kgo.ProducerBatchMaxBytes(4096))...), 1, 8192)
	require.NoError(t, err)
	require.Equal(t, 4096, max)
}

// A record over MaxRecordBytes is refused with its size; the headers are keiro's, with
// CloudEvents' for the configured destinations only.
func TestRecordAndSize(t *testing.T) {
	c := newClient(t, kgo.RequiredAcks(kgo.AllISRAcks()), kgo.ManualFlushing())
	p, err := publish.New(publish.Config{Client: c, MaxRecordBytes: 600, CloudEventsDestinations: []string{"ce"}})
	require.NoError(t, err)
	ev := envelope.Event{MessageID: "m1", Source: "s", EventType: "t", Destination: "orders", Payload: []byte(`{}`)}
	var rec kgo.Record
	headers := p.Record(&rec, &ev, nil)
	require.Equal(t, "orders", rec.Topic)
	require.Len(t, rec.Headers, len(headers))
	plain := len(rec.Headers)
	ev.Destination = "ce"
	p.Record(&rec, &ev, headers)
	require.Greater(t, len(rec.Headers), plain)
	size, err := p.CheckSize(&rec)
	require.Equal(t, publish.RecordSize(&rec), size)
	if size > 600 {
		require.ErrorContains(t, err, "exceeds the 600-byte limit")
	} else {
		require.NoError(t, err)
	}
	rec.Value = make([]byte, 1000)
	_, err = p.CheckSize(&rec)
	require.ErrorContains(t, err, "exceeds the 600-byte limit")
}

// A suspect is seen until it is taken or removed.
func TestSuspects(t *testing.T) {
	var s publish.Suspects[string]
	require.False(t, s.Has("a"))
	s.Add("a")
	require.True(t, s.Has("a"))
	require.True(t, s.Take("a"))
	require.False(t, s.Take("a"))
	s.Add("b")
	s.Remove("b")
	require.False(t, s.Has("b"))
}
