package handlers

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/keiro-go/keiro/inbox"
	"github.com/keiro-go/keiro/internal/testdb"
)

// BenchmarkDocument measures building and encoding the JSON document of one event.
func BenchmarkDocument(b *testing.B) {
	ev := testEvent()
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := MarshalDocument(ctx, ev, nil); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSQLMode compares one message per inbox transaction through the SQL handler
// (inbox row + function call + commit) with its limit: a raw INSERT of the same effect row
// and COMMIT per message, on the same database.
func BenchmarkSQLMode(b *testing.B) {
	db := testdb.New(b)
	_, err := db.Pool.Exec(context.Background(), fmt.Sprintf(`
CREATE TABLE %[1]s.effects (message_id text NOT NULL, amount int NOT NULL);
CREATE FUNCTION %[1]s.apply_event(doc jsonb) RETURNS void LANGUAGE sql AS $$
  INSERT INTO %[1]s.effects VALUES (doc->>'message_id', (doc->'payload'->>'amount')::int) $$;`, db.Schema))
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()

	b.Run("limit=raw-insert-commit", func(b *testing.B) {
		i := 0
		for b.Loop() {
			i++
			tx, err := db.Pool.Begin(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := tx.Exec(ctx, `INSERT INTO `+db.Schema+`.effects VALUES ($1, $2)`, fmt.Sprintf("raw-%d", i), 42); err != nil {
				b.Fatal(err)
			}
			if err := tx.Commit(ctx); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
	})
	b.Run("inbox+sql-handler", func(b *testing.B) {
		h, err := NewSQL(SQLConfig{Function: db.Schema + ".apply_event"})
		if err != nil {
			b.Fatal(err)
		}
		store, err := inbox.NewStore(inbox.StoreConfig{Schema: db.Schema, Consumer: "bench"})
		if err != nil {
			b.Fatal(err)
		}
		ev := testEvent()
		i := 0
		for b.Loop() {
			i++
			ev.MessageID = fmt.Sprintf("inbox-%d", i)
			res, err := store.Process(ctx, db.Pool, inbox.Delivery{Event: ev}, h.Handle)
			if err != nil || res.Outcome != inbox.Processed {
				b.Fatalf("process: %v %v", res.Outcome, err)
			}
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
	})
}

// BenchmarkHTTPMode compares the HTTP handler (document, headers, POST, classification) with
// its limit: a bare POST of a prepared body to the same loopback server.
func BenchmarkHTTPMode(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	ctx := context.Background()
	ev := testEvent()
	body, err := MarshalDocument(ctx, ev, nil)
	if err != nil {
		b.Fatal(err)
	}

	b.Run("limit=bare-post", func(b *testing.B) {
		cl := &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
		defer cl.CloseIdleConnections()
		for b.Loop() {
			resp, err := cl.Post(srv.URL, "application/json", bytes.NewReader(body))
			if err != nil {
				b.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
	})
	b.Run("http-handler", func(b *testing.B) {
		h, err := NewHTTP(HTTPConfig{URL: srv.URL, Consumer: "bench"})
		if err != nil {
			b.Fatal(err)
		}
		defer h.CloseIdleConnections()
		b.ReportAllocs()
		for b.Loop() {
			if err := h.Handle(ctx, nil, ev); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
	})
}
