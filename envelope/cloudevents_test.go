package envelope_test

import (
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/keiro-go/keiro/envelope"
)

func TestCloudEventsEncode(t *testing.T) {
	e := sample(t)
	e.OccurredAt = time.Date(2023, 2, 25, 10, 11, 12, 500000000, time.UTC)
	hs := e.AppendHeaders(nil, envelope.EncodeOptions{CloudEvents: true})
	keiro := e.Headers()
	if !reflect.DeepEqual(names(hs[:len(keiro)]), names(keiro)) {
		t.Fatalf("keiro headers not first: %q", names(hs))
	}
	want := [][2]string{
		{"ce_id", e.MessageID},
		{"ce_source", "ordering"},
		{"ce_type", "OrderSubmitted"},
		{"ce_specversion", "1.0"},
		{"ce_time", "2023-02-25T10:11:12.5Z"},
		{"ce_partitionkey", "order-123"},
	}
	ce := hs[len(keiro):]
	if len(ce) != len(want) {
		t.Fatalf("CloudEvents headers = %q", names(ce))
	}
	for i, w := range want {
		if ce[i].Key != w[0] || string(ce[i].Value) != w[1] {
			t.Errorf("header %d = %s: %q, want %s: %q", i, ce[i].Key, ce[i].Value, w[0], w[1])
		}
	}
	e.Key = nil
	if _, ok := find(e.AppendHeaders(nil, envelope.EncodeOptions{CloudEvents: true}), "ce_partitionkey"); ok {
		t.Fatal("ce_partitionkey emitted without a key")
	}
	// A record carrying both profiles decodes through the keiro headers to the same event.
	e = sample(t)
	got, err := envelope.Decode(e.Record(envelope.EncodeOptions{CloudEvents: true}))
	if err != nil {
		t.Fatal(err)
	}
	assertEqual(t, got, e)
}

// ceRecord is a record as a CloudEvents binary-mode producer sends it: no keiro headers.
func ceRecord() envelope.Record {
	return envelope.Record{
		Topic: "shipping.parcels.v2",
		Key:   []byte("parcel-9"),
		Value: []byte(`{"parcel":9}`),
		Headers: []envelope.Header{
			{Key: "ce_specversion", Value: []byte("1.0")},
			{Key: "ce_id", Value: []byte("A234-1234-1234")},
			{Key: "ce_source", Value: []byte("/shipping/parcels")},
			{Key: "ce_type", Value: []byte("com.example.parcel.shipped")},
			{Key: "ce_time", Value: []byte("2018-04-05T17:31:00.123+02:00")},
			{Key: "content-type", Value: []byte("application/json")},
			{Key: "traceparent", Value: []byte("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")},
		},
		Timestamp: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC),
	}
}

func TestCloudEventsDecode(t *testing.T) {
	e, err := envelope.Decode(ceRecord())
	if err != nil {
		t.Fatal(err)
	}
	want := envelope.Event{
		MessageID:     "A234-1234-1234",
		Source:        "/shipping/parcels",
		Destination:   "shipping.parcels.v2",
		Key:           ptr("parcel-9"),
		EventType:     "com.example.parcel.shipped",
		SchemaVersion: 0,
		ContentType:   "application/json",
		Payload:       []byte(`{"parcel":9}`),
		OccurredAt:    time.Date(2018, 4, 5, 15, 31, 0, 123000000, time.UTC),
		TraceContext:  &envelope.TraceContext{Traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
	}
	assertEqual(t, e, want)

	// What we decoded re-encodes to keiro headers that decode to the same event.
	again, err := envelope.Decode(recordOf(e))
	if err != nil {
		t.Fatal(err)
	}
	assertEqual(t, again, e)

	t.Run("keiro extras are read", func(t *testing.T) {
		r := with(with(with(ceRecord(), "keiro-schema-version", "4"), "keiro-destination", "other.topic"), "keiro-correlation-id", "018f0f18-17aa-7000-8000-000000000005")
		e, err := envelope.Decode(r)
		if err != nil {
			t.Fatal(err)
		}
		if e.SchemaVersion != 4 || e.Destination != "other.topic" || e.CorrelationID == nil {
			t.Fatalf("event = %+v", e)
		}
	})
	t.Run("lenient RFC 3339 time", func(t *testing.T) {
		e, err := envelope.Decode(with(ceRecord(), "ce_time", "2018-04-05t17:31:00.1234567890123456z"))
		if err != nil {
			t.Fatal(err)
		}
		if got := envelope.FormatTime(e.OccurredAt); got != "2018-04-05T17:31:00.123456789Z" {
			t.Fatalf("OccurredAt = %s", got)
		}
	})
	t.Run("no ce_time falls back to the record timestamp", func(t *testing.T) {
		r := without(ceRecord(), "ce_time")
		e, err := envelope.Decode(r)
		if err != nil {
			t.Fatal(err)
		}
		if !e.OccurredAt.Equal(r.Timestamp) {
			t.Fatalf("OccurredAt = %v", e.OccurredAt)
		}
	})

	errCases := []struct {
		name   string
		rec    envelope.Record
		is     error
		header string
	}{
		{"no specversion", without(ceRecord(), "ce_specversion"), envelope.ErrMissingHeader, "ce_specversion"},
		{"no id", without(ceRecord(), "ce_id"), envelope.ErrMissingHeader, "ce_id"},
		{"no source", without(ceRecord(), "ce_source"), envelope.ErrMissingHeader, "ce_source"},
		{"no type", without(ceRecord(), "ce_type"), envelope.ErrMissingHeader, "ce_type"},
		{"no content type", without(ceRecord(), "content-type"), envelope.ErrMissingHeader, "content-type"},
		{"no topic", func() envelope.Record { r := ceRecord(); r.Topic = ""; return r }(), envelope.ErrMissingHeader, "keiro-destination"},
		{"bad time", with(ceRecord(), "ce_time", "yesterday"), envelope.ErrInvalidTimeHeader, "ce_time"},
		{"bad schema version", with(ceRecord(), "keiro-schema-version", "v1"), envelope.ErrInvalidIntHeader, "keiro-schema-version"},
		{"source before type", without(without(ceRecord(), "ce_type"), "ce_source"), envelope.ErrMissingHeader, "ce_source"},
	}
	for _, c := range errCases {
		t.Run(c.name, func(t *testing.T) {
			_, err := envelope.Decode(c.rec)
			var he *envelope.HeaderError
			if !errors.Is(err, c.is) || !errors.As(err, &he) || he.Header != c.header {
				t.Fatalf("err = %v, want %v on %s", err, c.is, c.header)
			}
		})
	}

	t.Run("keiro headers take precedence", func(t *testing.T) {
		// keiro-source present: the keiro profile applies, so keiro-message-id is required.
		r := with(ceRecord(), "keiro-source", "ordering")
		_, err := envelope.Decode(r)
		var he *envelope.HeaderError
		if !errors.As(err, &he) || he.Header != "keiro-destination" {
			t.Fatalf("err = %v, want missing keiro-destination", err)
		}
	})
	t.Run("no ce headers reports keiro-source", func(t *testing.T) {
		_, err := envelope.Decode(envelope.Record{Topic: "t"})
		var he *envelope.HeaderError
		if !errors.As(err, &he) || he.Header != "keiro-source" {
			t.Fatalf("err = %v, want missing keiro-source", err)
		}
	})
}
