package translog

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"testing"
	"time"
)

// A storm of one kind is cut to the burst, then one line per second; the next line logged says
// how many were suppressed. Kinds have separate budgets.
func TestTransitionLogRateLimit(t *testing.T) {
	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	l := &Log{now: func() time.Time { return now }}
	logged := 0
	for range 1000 {
		if ok, sup := l.allow(Dead); ok {
			logged++
			if sup != 0 {
				t.Fatalf("suppressed %d before the budget was spent", sup)
			}
		}
	}
	if logged != Burst {
		t.Fatalf("logged %d of a storm of 1000, want the burst %d", logged, Burst)
	}
	if ok, _ := l.allow(Retried); !ok {
		t.Fatal("another kind shares the dead rows' budget")
	}
	now = now.Add(time.Second)
	ok, sup := l.allow(Dead)
	if !ok || sup != 1000-Burst {
		t.Fatalf("after a second: ok=%v suppressed=%d, want true and %d", ok, sup, 1000-Burst)
	}
	if ok, _ := l.allow(Dead); ok {
		t.Fatal("more than one line per second after the burst")
	}
	now = now.Add(time.Hour)
	for i := range Burst {
		if ok, _ := l.allow(Dead); !ok {
			t.Fatalf("line %d of a new burst refused: the bucket refills to the burst", i)
		}
	}
}

// A line names the row and its error at the kind's level; a retried row's backoff and a
// rejected row's code come with it; a line after suppressed ones is preceded by their count.
func TestWrite(t *testing.T) {
	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	l := &Log{now: func() time.Time { return now }}
	var buf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, nil))
	key := "k1"
	row := Row{OutboxID: "o1", MessageID: "m1", Source: "s", Destination: "t1", Key: &key, Attempt: 3,
		RetryIn: 2 * time.Second, Err: "broker down"}
	lines := func() []map[string]any {
		var out []map[string]any
		for _, line := range bytes.Split(bytes.TrimSpace(buf.Bytes()), []byte("\n")) {
			m := map[string]any{}
			if err := json.Unmarshal(line, &m); err != nil {
				t.Fatal(err)
			}
			out = append(out, m)
		}
		buf.Reset()
		return out
	}
	l.Write(context.Background(), log, Retried, row)
	got := lines()
	if len(got) != 1 || got[0]["level"] != "WARN" || got[0]["outbox_id"] != "o1" || got[0]["key"] != "k1" ||
		got[0]["attempt"] != 3.0 || got[0]["retry_in"] == nil || got[0]["err"] != "broker down" || got[0]["code"] != nil {
		t.Fatalf("retried line %v", got)
	}
	row.Key, row.Code = nil, "MESSAGE_TOO_LARGE"
	l.Write(context.Background(), log, Rejected, row)
	got = lines()
	if len(got) != 1 || got[0]["level"] != "ERROR" || got[0]["key"] != "" || got[0]["code"] != "MESSAGE_TOO_LARGE" || got[0]["retry_in"] != nil {
		t.Fatalf("rejected line %v", got)
	}
	for range Burst + 5 {
		l.Write(context.Background(), log, Dead, row)
	}
	if got := lines(); len(got) != Burst {
		t.Fatalf("%d dead lines of a storm, want the burst %d", len(got), Burst)
	}
	now = now.Add(time.Second)
	l.Write(context.Background(), log, Dead, row)
	got = lines()
	if len(got) != 2 || got[0]["suppressed"] != 5.0 || got[0]["kind"] != "dead" || got[1]["level"] != "ERROR" {
		t.Fatalf("lines after a suppressed storm %v", got)
	}
}
