package testenv_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/keirotest/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// recorder records failures instead of reporting them; Fatal ends the goroutine.
type recorder struct {
	testing.TB
	mu   sync.Mutex
	msgs []string
}

func (r *recorder) Helper() {}
func (r *recorder) Fatalf(format string, args ...any) {
	r.mu.Lock()
	r.msgs = append(r.msgs, fmt.Sprintf(format, args...))
	r.mu.Unlock()
	runtime.Goexit()
}

func record(t *testing.T, fn func(testing.TB)) string {
	r := &recorder{TB: t}
	done := make(chan struct{})
	go func() { defer close(done); fn(r) }()
	<-done
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Join(r.msgs, "\n")
}

func TestUnreachableDatabaseFailsWithDirections(t *testing.T) {
	t.Parallel()
	msg := record(t, func(tb testing.TB) {
		testenv.NewDBWith(tb, testenv.DBConfig{URL: "postgres://nobody:secret@127.0.0.1:1/postgres?sslmode=disable&connect_timeout=5"})
	})
	for _, want := range []string{"PostgreSQL is unreachable at 127.0.0.1:1", "set KEIRO_TEST_DATABASE_URL or DATABASE_URL"} {
		if !strings.Contains(msg, want) {
			t.Errorf("message lacks %q: %s", want, msg)
		}
	}
	if strings.Contains(msg, "secret") {
		t.Errorf("the message shows the password: %s", msg)
	}
}

func TestNewDBWithSkipMigrations(t *testing.T) {
	t.Parallel()
	db := testenv.NewDBWith(t, testenv.DBConfig{SkipMigrations: true})
	var tables int
	if err := db.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM pg_tables WHERE schemaname = $1`, db.Schema).Scan(&tables); err != nil {
		t.Fatal(err)
	}
	if tables != 0 {
		t.Fatalf("want an empty schema, got %d tables", tables)
	}
}

func TestDisableAutoCreate(t *testing.T) {
	t.Parallel()
	k := testenv.NewKafkaWith(t, testenv.KafkaConfig{Topics: []string{"known"}, DisableAutoCreate: true})
	cl := k.NewClient(t, kgo.RecordDeliveryTimeout(time.Second))
	ctx := context.Background()
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "known", Value: []byte("x")}).FirstErr(); err != nil {
		t.Fatalf("produce to a created topic: %v", err)
	}
	err := cl.ProduceSync(ctx, &kgo.Record{Topic: "unknown", Value: []byte("x")}).FirstErr()
	if !errors.Is(err, kerr.UnknownTopicOrPartition) && !errors.Is(err, kgo.ErrRecordTimeout) {
		t.Fatalf("want the unknown topic refused, got %v", err)
	}
}

func TestFailProducesForADuration(t *testing.T) {
	t.Parallel()
	k := testenv.NewKafka(t, "orders")
	outage := k.FailProduces(t, testenv.ProduceFailure{For: time.Hour, Err: kerr.InvalidRecord})
	ctx := context.Background()
	if err := k.Client.ProduceSync(ctx, &kgo.Record{Topic: "orders"}).FirstErr(); !errors.Is(err, kerr.InvalidRecord) {
		t.Fatalf("want INVALID_RECORD during the outage, got %v", err)
	}
	<-outage.Hit()
	outage.End()
	outage.End() // twice is harmless
	if err := k.Client.ProduceSync(ctx, &kgo.Record{Topic: "orders"}).FirstErr(); err != nil {
		t.Fatalf("produce after the outage: %v", err)
	}
	if outage.Refused() != 1 {
		t.Fatalf("want 1 refused request, got %d", outage.Refused())
	}
}

// Both brokers: topics the test names are its own, records come back in order, and a real
// broker's namespace is gone when the test ends.
func TestEachKafka(t *testing.T) {
	var realTopic string
	var realKafka *testenv.Kafka
	testenv.EachKafka(t, testenv.KafkaConfig{Topics: []string{"orders"}, Partitions: 2}, func(t *testing.T, k *testenv.Kafka) {
		topic := k.Topic("orders")
		if k.Real() {
			if !strings.HasSuffix(topic, "-orders") || topic == "orders" {
				t.Fatalf("Topic(orders) on a real broker = %q, want a namespaced name", topic)
			}
			if k.Cluster != nil {
				t.Fatal("a real broker has no kfake cluster")
			}
			realTopic, realKafka = topic, k
		} else if topic != "orders" {
			t.Fatalf("Topic(orders) on the embedded broker = %q", topic)
		}
		ctx := context.Background()
		for i := range 5 {
			r := &kgo.Record{Topic: topic, Key: []byte("k"), Value: []byte(fmt.Sprint(i))}
			if err := k.Client.ProduceSync(ctx, r).FirstErr(); err != nil {
				t.Fatalf("produce: %v", err)
			}
		}
		recs := k.Records(t, topic)
		if len(recs) != 5 {
			t.Fatalf("read %d records, want 5", len(recs))
		}
		for i, r := range recs {
			if string(r.Value) != fmt.Sprint(i) {
				t.Fatalf("record %d is %q", i, r.Value)
			}
		}
		if k.Real() {
			// The real broker the kit starts creates no topic on first use.
			err := k.Client.ProduceSync(ctx, &kgo.Record{Topic: k.Topic("never-created")}).FirstErr()
			if !errors.Is(err, kerr.UnknownTopicOrPartition) {
				t.Fatalf("produce to a topic nobody created: %v, want UNKNOWN_TOPIC_OR_PARTITION", err)
			}
		}
	})
	if realKafka == nil {
		t.Fatal("the real-broker run did not happen")
	}
	seeds, err := testenv.RealKafkaSeeds()
	if err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	// Deletion is asynchronous: the brokers learn of it from the controller shortly after.
	for deadline := time.Now().Add(30 * time.Second); ; {
		md, err := kadm.NewClient(cl).ListTopics(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if !md.Has(realTopic) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("topic %s outlived its test", realTopic)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
