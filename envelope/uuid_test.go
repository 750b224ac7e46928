package envelope_test

import (
	"bytes"
	"database/sql"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keiro-go/keiro/envelope"
)

func TestUUIDv7Monotonic(t *testing.T) {
	const n = 100000 // far more than 4096 per millisecond: exercises the counter overflow
	prev := envelope.NewUUIDv7()
	for range n {
		u := envelope.NewUUIDv7()
		if bytes.Compare(prev[:], u[:]) >= 0 {
			t.Fatalf("not increasing: %s then %s", prev, u)
		}
		if u[6]>>4 != 7 || u[8]>>6 != 2 {
			t.Fatalf("%s: version %d variant %b", u, u[6]>>4, u[8]>>6)
		}
		prev = u
	}
	ms := int64(prev[0])<<40 | int64(prev[1])<<32 | int64(prev[2])<<24 | int64(prev[3])<<16 | int64(prev[4])<<8 | int64(prev[5])
	if d := time.Since(time.UnixMilli(ms)); d < -2*time.Second || d > time.Minute {
		t.Fatalf("timestamp %v is %v from now", time.UnixMilli(ms), d)
	}
}

func TestUUIDv7ConcurrentUnique(t *testing.T) {
	const workers, each = 4, 5000
	var mu sync.Mutex
	seen := make(map[envelope.UUID]bool, workers*each)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			local := make([]envelope.UUID, each)
			for i := range local {
				local[i] = envelope.NewUUIDv7()
			}
			mu.Lock()
			defer mu.Unlock()
			for _, u := range local {
				if seen[u] {
					t.Errorf("duplicate %s", u)
				}
				seen[u] = true
			}
		})
	}
	wg.Wait()
}

func TestParseUUID(t *testing.T) {
	for range 1000 {
		u := envelope.NewUUIDv7()
		got, err := envelope.ParseUUID(u.String())
		if err != nil || got != u {
			t.Fatalf("ParseUUID(%s) = %s, %v", u, got, err)
		}
	}
	u, err := envelope.ParseUUID("018F0F18-17AA-7000-8000-0000000000AA")
	if err != nil || u.String() != "018f0f18-17aa-7000-8000-0000000000aa" {
		t.Fatalf("uppercase: %s, %v", u, err)
	}
	if !(envelope.UUID{}).IsZero() || u.IsZero() {
		t.Fatal("IsZero")
	}
	for _, bad := range []string{
		"", "018f0f18-17aa-7000-8000-0000000000a", "018f0f18-17aa-7000-8000-0000000000aaa",
		"018f0f1817aa70008000-0000000000aa-xx", "018f0f18-17aa-7000-8000-0000000000ag",
		"{018f0f18-17aa-7000-8000-0000000000aa}", "018f0f18_17aa_7000_8000_0000000000aa",
		"+18f0f18-17aa-7000-8000-0000000000aa",
	} {
		if _, err := envelope.ParseUUID(bad); !errors.Is(err, envelope.ErrInvalidUUID) {
			t.Errorf("ParseUUID(%q) err = %v", bad, err)
		}
	}
}

// A UUID renders as its text form in JSON and slog, and reads back from it.
func TestUUIDTextJSONAndSlog(t *testing.T) {
	u, err := envelope.ParseUUID("01936B2A-7C4F-7A3E-8F1B-2C3D4E5F6A7B")
	if err != nil {
		t.Fatal(err)
	}
	const want = "01936b2a-7c4f-7a3e-8f1b-2c3d4e5f6a7b"
	type doc struct {
		ID  envelope.UUID  `json:"id"`
		Opt *envelope.UUID `json:"opt"`
	}
	b, err := json.Marshal(doc{ID: u, Opt: &u})
	if err != nil || string(b) != `{"id":"`+want+`","opt":"`+want+`"}` {
		t.Fatalf("json: %s %v", b, err)
	}
	var back doc
	if err := json.Unmarshal(b, &back); err != nil || back.ID != u || *back.Opt != u {
		t.Fatalf("json round trip: %+v %v", back, err)
	}
	if err := json.Unmarshal([]byte(`{"id":"not-a-uuid"}`), &back); !errors.Is(err, envelope.ErrInvalidUUID) {
		t.Fatalf("bad json uuid: %v", err)
	}

	var jb, tb bytes.Buffer
	slog.New(slog.NewJSONHandler(&jb, nil)).Info("m", "id", u)
	slog.New(slog.NewTextHandler(&tb, nil)).Info("m", "id", u)
	if !strings.Contains(jb.String(), `"id":"`+want+`"`) || !strings.Contains(tb.String(), "id="+want) {
		t.Fatalf("slog: %s %s", jb.String(), tb.String())
	}

	var t2 envelope.UUID
	if err := t2.UnmarshalText([]byte(want)); err != nil || t2 != u {
		t.Fatalf("UnmarshalText: %s %v", t2, err)
	}
	if a, _ := u.AppendText([]byte("id=")); string(a) != "id="+want {
		t.Fatalf("AppendText: %s", a)
	}
}

// Value and Scan round-trip through database/sql's driver values: the text form and raw bytes.
func TestUUIDValueScan(t *testing.T) {
	u := envelope.NewUUIDv7()
	v, err := u.Value()
	if err != nil || v != u.String() {
		t.Fatalf("Value: %v %v", v, err)
	}
	for _, src := range []any{u.String(), []byte(u.String()), u[:], strings.ToUpper(u.String())} {
		var got envelope.UUID
		if err := got.Scan(src); err != nil || got != u {
			t.Fatalf("Scan(%T %v): %s %v", src, src, got, err)
		}
	}
	for _, bad := range []any{nil, 42, "nope", []byte{1, 2, 3}} {
		var got envelope.UUID
		if err := got.Scan(bad); !errors.Is(err, envelope.ErrInvalidUUID) {
			t.Fatalf("Scan(%T %v): %v", bad, bad, err)
		}
	}
	var _ driver.Valuer = u
	var _ sql.Scanner = &u
}
