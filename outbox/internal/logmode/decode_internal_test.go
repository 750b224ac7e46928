package logmode

import (
	"bytes"
	"encoding/binary"
	"math"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/outbox/internal/publish"
)

// logColumns are keiro_outbox_log's columns in the table's order (009_outbox_log.sql),
// outbox_id and created_at included: the relation the decoding meets.
var logColumns = []struct {
	name string
	oid  uint32
}{
	{"outbox_id", oidUUID}, {"message_id", oidText}, {"source", oidText}, {"destination", oidText},
	{"message_key", oidText}, {"event_type", oidText}, {"schema_version", oidInt8}, {"content_type", oidText},
	{"schema_registry", oidText}, {"schema_subject", oidText}, {"schema_version_ref", oidInt8}, {"schema_id", oidInt8},
	{"schema_fingerprint", oidText}, {"source_event_id", oidUUID}, {"source_global_position", oidInt8},
	{"causation_id", oidUUID}, {"correlation_id", oidUUID}, {"traceparent", oidText}, {"tracestate", oidText},
	{"payload_bytes", oidBytea}, {"attributes", oidJSONB}, {"occurred_at", oidTimestamptz}, {"created_at", oidTimestamptz},
}

// testLayout is the layout of keiro_outbox_log's Relation message.
func testLayout(t testing.TB) *layout {
	rel := &pglogrepl.RelationMessage{Namespace: "keiro", RelationName: "keiro_outbox_log"}
	for _, c := range logColumns {
		rel.Columns = append(rel.Columns, &pglogrepl.RelationMessageColumn{Name: c.name, DataType: c.oid})
	}
	l, err := newLayout(rel)
	require.NoError(t, err)
	return l
}

// tupleValue is one column of an encoded tuple: binary unless null.
type tupleValue struct {
	null bool
	kind byte // tupleBinary unless set
	data []byte
}

// encodeTuple encodes values as pgoutput's TupleData.
func encodeTuple(values []tupleValue) []byte {
	b := binary.BigEndian.AppendUint16(nil, uint16(len(values)))
	for _, v := range values {
		if v.null {
			b = append(b, tupleNull)
			continue
		}
		kind := v.kind
		if kind == 0 {
			kind = tupleBinary
		}
		b = append(b, kind)
		b = binary.BigEndian.AppendUint32(b, uint32(len(v.data)))
		b = append(b, v.data...)
	}
	return b
}

// rowValues are the tuple values of a row, by column name; columns not named are null.
func rowValues(named map[string][]byte) []tupleValue {
	out := make([]tupleValue, len(logColumns))
	for i, c := range logColumns {
		if v, ok := named[c.name]; ok {
			out[i] = tupleValue{data: v}
		} else {
			out[i] = tupleValue{null: true}
		}
	}
	return out
}

func be64(v int64) []byte { return binary.BigEndian.AppendUint64(nil, uint64(v)) }

// benchRow is a row as the relayrss harness writes it: 1 KiB of JSON payload, a key, no
// optional column.
func benchRow(payload int) map[string][]byte {
	return map[string][]byte{
		"outbox_id": make([]byte, 16), "message_id": []byte("m123456"), "source": []byte("ordering"),
		"destination": []byte("orders"), "message_key": []byte("k1234"), "event_type": []byte("E"),
		"schema_version": be64(1), "content_type": []byte("application/json"),
		"payload_bytes": bytes.Repeat([]byte("x"), payload), "occurred_at": be64(851_000_000_000_000),
		"created_at": be64(851_000_000_000_000),
	}
}

func TestRowDecodesEveryColumn(t *testing.T) {
	l := testLayout(t)
	id := envelope.UUID{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
	v := benchRow(3)
	v["schema_registry"], v["schema_subject"], v["schema_fingerprint"] = []byte("reg"), []byte("subj"), []byte("fp")
	v["schema_version_ref"], v["schema_id"], v["source_global_position"] = be64(7), be64(42), be64(-3)
	v["source_event_id"], v["causation_id"], v["correlation_id"] = id[:], id[:], id[:]
	v["traceparent"], v["tracestate"] = []byte("00-tp-01"), []byte("k=v")
	v["attributes"] = []byte("\x01{\"a\": 1}")
	tuple := encodeTuple(rowValues(v))
	r, err := l.row(tuple)
	require.NoError(t, err)
	clear(tuple) // the row keeps copies, not the read buffer
	e := r.ev
	require.Equal(t, "m123456", e.MessageID)
	require.Equal(t, "ordering", e.Source)
	require.Equal(t, "orders", e.Destination)
	require.Equal(t, "k1234", *e.Key)
	require.Equal(t, []byte("k1234"), r.rec.Key)
	require.Equal(t, "E", e.EventType)
	require.Equal(t, int64(1), e.SchemaVersion)
	require.Equal(t, "application/json", e.ContentType)
	require.Equal(t, "reg", *e.SchemaRef.Registry)
	require.Equal(t, "subj", *e.SchemaRef.Subject)
	require.Equal(t, "fp", *e.SchemaRef.Fingerprint)
	require.Equal(t, int64(7), *e.SchemaRef.Version)
	require.Equal(t, int64(42), *e.SchemaRef.SchemaID)
	require.Equal(t, id, *e.SourceEventID)
	require.Equal(t, int64(-3), *e.SourceGlobalPosition)
	require.Equal(t, id, *e.CausationID)
	require.Equal(t, id, *e.CorrelationID)
	require.Equal(t, envelope.TraceContext{Traceparent: "00-tp-01", Tracestate: "k=v"}, *e.TraceContext)
	require.Equal(t, []byte("xxx"), e.Payload)
	require.JSONEq(t, `{"a": 1}`, string(e.Attributes))
	require.Equal(t, pgEpoch.Add(851_000_000_000_000*time.Microsecond), e.OccurredAt)
}

func TestRowDecodesNullsAndEmpties(t *testing.T) {
	l := testLayout(t)
	v := benchRow(0)
	delete(v, "message_key")
	r, err := l.row(encodeTuple(rowValues(v)))
	require.NoError(t, err)
	require.Nil(t, r.ev.Key)
	require.Nil(t, r.rec.Key, "a null key stays null")
	require.NotNil(t, r.ev.Payload, "an empty payload is not null")
	require.Empty(t, r.ev.Payload)
	require.Nil(t, r.ev.SchemaRef)
	require.Nil(t, r.ev.TraceContext)
	require.Nil(t, r.ev.Attributes)

	v["message_key"] = []byte{}
	r, err = l.row(encodeTuple(rowValues(v)))
	require.NoError(t, err)
	require.Equal(t, "", *r.ev.Key)
	require.NotNil(t, r.rec.Key, "an empty key is not null")
}

func TestRowRejectsBadTuples(t *testing.T) {
	l := testLayout(t)
	good := encodeTuple(rowValues(benchRow(8)))
	for name, tc := range map[string]struct {
		tuple []byte
		want  string
	}{
		"empty":         {nil, "no column count"},
		"column count":  {encodeTuple(rowValues(benchRow(8))[:5]), "tuple has 5 columns, the relation 23"},
		"truncated":     {good[:len(good)-3], "bytes, the tuple has"},
		"no kind":       {good[:2], "ends before column 1"},
		"unknown kind":  {append(binary.BigEndian.AppendUint16(nil, 23), 'x'), "unknown tuple data kind"},
		"cut in length": {append(binary.BigEndian.AppendUint16(nil, 23), 'b', 0, 0), "ends in the length"},
		"required null": {encodeTuple(func() []tupleValue { v := rowValues(benchRow(8)); v[1] = tupleValue{null: true}; return v }()), "column message_id is null"},
		"text format":   {encodeTuple(func() []tupleValue { v := rowValues(benchRow(8)); v[19].kind = tupleText; return v }()), "column payload_bytes is null"},
		"short int8":    {encodeTuple(func() []tupleValue { v := rowValues(benchRow(8)); v[6].data = []byte{1}; return v }()), "column schema_version: 1 bytes, want 8"},
		"short uuid":    {encodeTuple(func() []tupleValue { v := rowValues(benchRow(8)); v[13] = tupleValue{data: []byte{1}}; return v }()), "column source_event_id: 1 bytes, want 16"},
		"jsonb version": {encodeTuple(func() []tupleValue { v := rowValues(benchRow(8)); v[20] = tupleValue{data: []byte("{}")}; return v }()), "unknown jsonb format version"},
		"huge length":   {append(binary.BigEndian.AppendUint16(nil, 23), 'b', 0xff, 0xff, 0xff, 0xff), "bytes, the tuple has"},
		"unchanged toast": {encodeTuple(func() []tupleValue {
			v := rowValues(benchRow(8))
			v[19] = tupleValue{kind: tupleUnchanged, null: true}
			return v
		}()), "column payload_bytes is null"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := l.row(tc.tuple)
			require.ErrorContains(t, err, tc.want)
		})
	}
}

// FuzzRowDecode feeds the tuple decoder outside bytes: it must return a row or an error,
// never panic, and a row it returns must not alias the input.
func FuzzRowDecode(f *testing.F) {
	f.Add(encodeTuple(rowValues(benchRow(16))))
	v := benchRow(4)
	v["attributes"], v["traceparent"] = []byte("\x01{}"), []byte("tp")
	f.Add(encodeTuple(rowValues(v)))
	f.Add([]byte{0, 23, 'n'})
	l := testLayout(f)
	f.Fuzz(func(t *testing.T, tuple []byte) {
		r, err := l.row(tuple)
		if err != nil {
			return
		}
		payload := bytes.Clone(r.ev.Payload)
		id := r.ev.MessageID
		for i := range tuple {
			tuple[i] ^= 0xff
		}
		require.Equal(t, payload, r.ev.Payload)
		require.Equal(t, id, r.ev.MessageID)
	})
}

// BenchmarkRowRecord measures the decode → record path of one insert of the relayrss
// harness's row (1 KiB payload): the allocations per record, and the heap a record in flight
// keeps (retained-B/record: 4,096 rows held past a collection).
//
//	go test ./outbox/internal/logmode/ -run '^$' -bench RowRecord -benchmem
func BenchmarkRowRecord(b *testing.B) {
	l := testLayout(b)
	client, err := kgo.NewClient(kgo.RequiredAcks(kgo.AllISRAcks()), kgo.ManualFlushing())
	if err != nil {
		b.Fatal(err)
	}
	defer client.Close()
	pub, err := publish.New(publish.Config{Client: client})
	if err != nil {
		b.Fatal(err)
	}
	tuples := make([][]byte, 64)
	for i := range tuples {
		v := benchRow(1024)
		v["message_id"] = []byte("m" + strconv.Itoa(1e6+i))
		tuples[i] = encodeTuple(rowValues(v))
	}
	var headers []envelope.Header
	build := func(i int) *row {
		r, err := l.row(tuples[i%len(tuples)])
		if err != nil {
			b.Fatal(err)
		}
		headers = pub.Record(&r.rec, &r.ev, headers)
		return r
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		build(i)
	}
	b.StopTimer()
	const held = 4096
	keep := make([]*row, held)
	var m0, m1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m0)
	for i := range keep {
		keep[i] = build(i)
	}
	runtime.GC()
	runtime.ReadMemStats(&m1)
	b.ReportMetric(float64(m1.HeapAlloc-m0.HeapAlloc)/held, "retained-B/record")
	runtime.KeepAlive(keep)
}

// An occurred_at beyond a time.Duration's 292 years from 2000 decodes exactly (it wrapped
// around before); one of ±infinity is the row's failure (badRowError), with the rest of the
// row decoded for its dead letter, not the stream's.
func TestRowOccurredAtRange(t *testing.T) {
	l := testLayout(t)
	v := benchRow(2)
	far := time.Date(2400, 2, 29, 12, 0, 0, 123456000, time.UTC)
	v["occurred_at"] = be64((far.Unix()-pgEpoch.Unix())*1_000_000 + 123456)
	r, err := l.row(encodeTuple(rowValues(v)))
	require.NoError(t, err)
	require.Equal(t, far, r.ev.OccurredAt)
	old := time.Date(1650, 1, 1, 0, 0, 0, 0, time.UTC)
	v["occurred_at"] = be64(-(pgEpoch.Unix() - old.Unix()) * 1_000_000)
	r, err = l.row(encodeTuple(rowValues(v)))
	require.NoError(t, err)
	require.Equal(t, old, r.ev.OccurredAt)
	for _, inf := range []int64{math.MaxInt64, math.MinInt64} {
		v["occurred_at"] = be64(inf)
		_, err := l.row(encodeTuple(rowValues(v)))
		var bad *badRowError
		require.ErrorAs(t, err, &bad)
		require.ErrorContains(t, err, "infinity")
		require.Equal(t, "m123456", bad.r.ev.MessageID)
		require.Equal(t, "orders", bad.r.ev.Destination)
		require.True(t, bad.r.ev.OccurredAt.IsZero())
	}
}

// A row recycled once its record was acknowledged is decoded into again with its payload's
// buffer and its record's header slice: a steady stream allocates neither per row, and the
// recycled row carries nothing of the row before it (a shorter payload, no key, no trace
// context). An empty payload stays non-null in a recycled row too.
func TestRowRecycled(t *testing.T) {
	l := testLayout(t)
	client, err := kgo.NewClient(kgo.SeedBrokers("127.0.0.1:1"), kgo.RequiredAcks(kgo.AllISRAcks()), kgo.ManualFlushing())
	require.NoError(t, err)
	t.Cleanup(client.Close)
	pub, err := publish.New(publish.Config{Client: client})
	require.NoError(t, err)

	full := benchRow(1024)
	full["traceparent"] = []byte("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
	tuple := encodeTuple(rowValues(full))
	var headers []envelope.Header
	cycle := func() {
		r, err := l.row(tuple)
		require.NoError(t, err)
		headers = pub.Record(&r.rec, &r.ev, headers)
		r.recycle()
	}
	cycle()
	allocs := testing.AllocsPerRun(200, cycle)
	// Left per row: the text columns' string, the key's bytes, the headers' values.
	require.LessOrEqual(t, allocs, 3.5)

	short := benchRow(0)
	delete(short, "message_key")
	r, err := l.row(encodeTuple(rowValues(short)))
	require.NoError(t, err)
	require.NotNil(t, r.ev.Payload, "an empty payload is not null")
	require.Empty(t, r.ev.Payload)
	require.Nil(t, r.ev.Key)
	require.Nil(t, r.rec.Key)
	require.Nil(t, r.ev.TraceContext)
	require.Nil(t, r.rec.Value)
	require.Empty(t, r.rec.Headers)
	require.Empty(t, r.rec.Topic)
}
