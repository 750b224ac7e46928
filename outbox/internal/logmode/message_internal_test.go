package logmode

import (
	"bytes"
	"encoding/binary"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/outbox/internal/logmsg"
)

func ptr[T any](v T) *T { return &v }

// fullEvent is an event with every optional field set.
func fullEvent() (envelope.Event, *envelope.TraceContext) {
	sourceEvent, causation, correlation := envelope.NewUUIDv7(), envelope.NewUUIDv7(), envelope.NewUUIDv7()
	e := envelope.Event{MessageID: "m1", Source: "ordering", Destination: "orders", Key: ptr("k1"),
		EventType: "OrderPlaced", SchemaVersion: 3, ContentType: envelope.ContentTypeJSON,
		SchemaRef: &envelope.SchemaRef{Registry: ptr("reg"), Subject: ptr("orders-value"), Version: ptr(int64(4)),
			SchemaID: ptr(int64(17)), Fingerprint: ptr("sha256:ab")},
		SourceEventID: &sourceEvent, SourceGlobalPosition: ptr(int64(42)), CausationID: &causation,
		CorrelationID: &correlation, Payload: []byte(`{"n":1}`), Attributes: []byte(`{"tenant": "t1"}`),
		OccurredAt: time.Date(2026, 12, 6, 22, 41, 7, 123456789, time.UTC)}
	return e, &envelope.TraceContext{Traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", Tracestate: "k=v"}
}

// pgMessage is a pgoutput 'M' message of prefix and content, as the server sends it.
func pgMessage(transactional bool, lsn uint64, prefix string, content []byte) []byte {
	b := []byte{'M', 0}
	if transactional {
		b[1] = 1
	}
	b = binary.BigEndian.AppendUint64(b, lsn)
	b = append(append(b, prefix...), 0)
	b = binary.BigEndian.AppendUint32(b, uint32(len(content)))
	return append(b, content...)
}

// An event encoded by logmsg.Append (what EmitTx writes) decodes with the row decoder into the
// same event, every optional field included; without the optional fields too.
func TestMessageRoundTrip(t *testing.T) {
	e, tc := fullEvent()
	content := logmsg.Append(nil, &e, tc)
	require.LessOrEqual(t, len(content), logmsg.Size(&e, tc))
	m, err := parseMessage(pgMessage(true, 0x16B3748, logmsg.Prefix("keiro"), content))
	require.NoError(t, err)
	require.True(t, m.transactional)
	require.Equal(t, "keiro.outbox:keiro", string(m.prefix))
	r, err := decodeMessage(m.content)
	require.NoError(t, err)
	want := e
	want.OccurredAt = e.OccurredAt.Truncate(time.Microsecond)
	want.TraceContext = tc
	require.Equal(t, want, r.ev)
	require.Equal(t, []byte("k1"), r.rec.Key)

	bare := envelope.Event{MessageID: "m2", Source: "s", Destination: "d", EventType: "E",
		ContentType: envelope.ContentTypeJSON, Payload: []byte{}, OccurredAt: want.OccurredAt}
	r, err = decodeMessage(logmsg.Append(nil, &bare, nil))
	require.NoError(t, err)
	require.Equal(t, bare, r.ev)
}

// Contents that are not an event fail with a reason: empty, an unknown version, a truncated
// tuple; a whole tuple whose values do not make an event is a bad row (dead-lettered with
// what decoded).
func TestMessageBadContent(t *testing.T) {
	e, tc := fullEvent()
	good := logmsg.Append(nil, &e, tc)
	_, err := decodeMessage(nil)
	require.ErrorContains(t, err, "no format version")
	_, err = decodeMessage(append([]byte{7}, good[1:]...))
	require.ErrorIs(t, err, logmsg.ErrUnknownVersion)
	_, err = decodeMessage(good[:len(good)-3])
	require.ErrorContains(t, err, "format 1")
	// A null required column (the message id) in a whole tuple.
	bad := []byte{logmsg.Version, 0, byte(len(logmsg.Columns)), 'n'}
	bad = append(bad, good[3+5+len(e.MessageID):]...)
	_, err = decodeMessage(bad)
	var br *badRowError
	require.ErrorAs(t, err, &br)
	require.Equal(t, "ordering", br.r.ev.Source)

	_, err = parseMessage([]byte{'M', 1, 0, 0, 0, 0, 0, 0, 0, 1, 'a'})
	require.ErrorContains(t, err, "NUL")
	_, err = parseMessage(pgMessage(true, 1, "p", []byte("abc"))[:15])
	require.Error(t, err)
}

// FuzzMessageDecode feeds the message decoder outside bytes (a pgoutput 'M' message whose
// content is anything): it must return an event or an error, never panic, and an event it
// returns must not alias the input.
func FuzzMessageDecode(f *testing.F) {
	e, tc := fullEvent()
	f.Add(logmsg.Append(nil, &e, tc))
	f.Add([]byte{logmsg.Version, 0, 21, 'n'})
	f.Add([]byte{2})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, content []byte) {
		m, err := parseMessage(pgMessage(true, 1, "keiro.outbox:s", content))
		require.NoError(t, err)
		r, err := decodeMessage(m.content)
		if err != nil {
			if r != nil {
				t.Fatalf("row and error %v", err)
			}
			return
		}
		payload := bytes.Clone(r.ev.Payload)
		id := r.ev.MessageID
		for i := range m.content {
			m.content[i] ^= 0xff
		}
		require.Equal(t, payload, r.ev.Payload)
		require.Equal(t, id, r.ev.MessageID)
	})
}
