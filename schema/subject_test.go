package schema_test

import (
	"strings"
	"testing"

	"github.com/keiro-go/keiro/schema"
)

func contains(s, sub string) bool { return strings.Contains(s, sub) }

func TestSubjectStrategies(t *testing.T) {
	t.Parallel()
	cases := []struct {
		strategy   schema.SubjectStrategy
		topic      string
		record     string
		key        bool
		want       string
		wantErrSub string
	}{
		{schema.TopicNameStrategy, "orders.v1", "com.acme.OrderPlaced", false, "orders.v1-value", ""},
		{schema.TopicNameStrategy, "orders.v1", "com.acme.OrderPlaced", true, "orders.v1-key", ""},
		{schema.TopicNameStrategy, "orders.v1", "", false, "orders.v1-value", ""},
		{schema.TopicNameStrategy, "", "x", false, "", "topic is empty"},
		{schema.RecordNameStrategy, "orders.v1", "com.acme.OrderPlaced", false, "com.acme.OrderPlaced", ""},
		{schema.RecordNameStrategy, "orders.v1", "com.acme.OrderPlaced", true, "com.acme.OrderPlaced", ""},
		{schema.RecordNameStrategy, "orders.v1", "", false, "", "no name"},
		{schema.TopicRecordNameStrategy, "orders.v1", "com.acme.OrderPlaced", false, "orders.v1-com.acme.OrderPlaced", ""},
		{schema.TopicRecordNameStrategy, "orders.v1", "", false, "", "no name"},
		{schema.TopicRecordNameStrategy, "", "com.acme.X", false, "", "topic is empty"},
		{schema.SubjectStrategy(42), "t", "r", false, "", "unknown strategy"},
	}
	for _, tc := range cases {
		got, err := tc.strategy.Subject(tc.topic, tc.record, tc.key)
		if tc.wantErrSub != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErrSub) {
				t.Errorf("%s(%q, %q): err = %v, want one mentioning %q", tc.strategy, tc.topic, tc.record, err, tc.wantErrSub)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%s(%q, %q, key=%v) = %q, %v; want %q", tc.strategy, tc.topic, tc.record, tc.key, got, err, tc.want)
		}
	}
}

func TestParseSubjectStrategy(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]schema.SubjectStrategy{
		"": schema.TopicNameStrategy, "topic": schema.TopicNameStrategy, "TopicNameStrategy": schema.TopicNameStrategy,
		"record": schema.RecordNameStrategy, "RecordNameStrategy": schema.RecordNameStrategy,
		"topic-record": schema.TopicRecordNameStrategy, " TopicRecordNameStrategy ": schema.TopicRecordNameStrategy,
	} {
		got, err := schema.ParseSubjectStrategy(in)
		if err != nil || got != want {
			t.Errorf("ParseSubjectStrategy(%q) = %v, %v; want %v", in, got, err, want)
		}
		if err == nil && got.String() != want.String() {
			t.Errorf("String mismatch")
		}
	}
	if _, err := schema.ParseSubjectStrategy("by-day"); err == nil {
		t.Fatal("unknown strategy accepted")
	}
}

// The serializer derives its subject from the strategy and the schema's full name.
func TestSerializerSubject(t *testing.T) {
	t.Parallel()
	reg := newRegistry(t, "http://127.0.0.1:1")
	for strategy, want := range map[schema.SubjectStrategy]string{
		schema.TopicNameStrategy:       "orders.v1-value",
		schema.RecordNameStrategy:      "com.acme.orders.OrderPlaced",
		schema.TopicRecordNameStrategy: "orders.v1-com.acme.orders.OrderPlaced",
	} {
		ser, err := schema.NewSerializer(reg, orderSchema, schema.SerializerConfig{SubjectStrategy: strategy})
		if err != nil {
			t.Fatal(err)
		}
		if got, err := ser.Subject("orders.v1"); err != nil || got != want {
			t.Errorf("%s: Subject = %q, %v; want %q", strategy, got, err, want)
		}
	}
	prim, err := schema.NewSerializer(reg, `"string"`, schema.SerializerConfig{SubjectStrategy: schema.RecordNameStrategy})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := prim.Subject("orders.v1"); err == nil {
		t.Fatal("RecordNameStrategy accepted an unnamed schema")
	}
}
