package handlers

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/inbox"
	"github.com/keiro-go/keiro/keirotest/testenv"
)

// benchSeq numbers benchmark messages, unique across runs of -count.
var benchSeq atomic.Int64

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
	db := testenv.NewDB(b)
	_, err := db.Pool.Exec(context.Background(), fmt.Sprintf(`
CREATE TABLE %[1]s.effects (message_id text NOT NULL, amount int NOT NULL);
CREATE FUNCTION %[1]s.apply_event(doc jsonb) RETURNS void LANGUAGE sql AS $$
  INSERT INTO %[1]s.effects VALUES (doc->>'message_id', (doc->'payload'->>'amount')::int) $$;`, db.Schema))
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()

	b.Run("limit=raw-insert-commit", func(b *testing.B) {
		for b.Loop() {
			i := benchSeq.Add(1)
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
		for b.Loop() {
			ev.MessageID = fmt.Sprintf("inbox-%d", benchSeq.Add(1))
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

// BenchmarkSQLModeBatch compares batches of 100 messages through the inbox with the SQL
// handler's batch path (inbox rows + 100 pipelined function calls + one commit) with its limit:
// one multi-row INSERT of the same 100 effect rows and a commit.
func BenchmarkSQLModeBatch(b *testing.B) {
	const batch = 100
	db := testenv.NewDB(b)
	_, err := db.Pool.Exec(context.Background(), fmt.Sprintf(`
CREATE TABLE %[1]s.effects (message_id text NOT NULL, amount int NOT NULL);
CREATE FUNCTION %[1]s.apply_event(doc jsonb) RETURNS void LANGUAGE sql AS $$
  INSERT INTO %[1]s.effects VALUES (doc->>'message_id', (doc->'payload'->>'amount')::int) $$;`, db.Schema))
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()

	b.Run("limit=raw-batched-insert", func(b *testing.B) {
		ids, amounts := make([]string, batch), make([]int32, batch)
		n := 0
		for b.Loop() {
			for j := range batch {
				n++
				ids[j], amounts[j] = fmt.Sprintf("raw-%d", n), 42
			}
			tx, err := db.Pool.Begin(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := tx.Exec(ctx, `INSERT INTO `+db.Schema+`.effects SELECT * FROM unnest($1::text[], $2::int[])`, ids, amounts); err != nil {
				b.Fatal(err)
			}
			if err := tx.Commit(ctx); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "msgs/s")
	})
	b.Run("inbox-batch+no-op-handler", func(b *testing.B) {
		// The inbox's share: dedupe rows of the batch and the commit, no effects.
		store, err := inbox.NewStore(inbox.StoreConfig{Schema: db.Schema, Consumer: "bench-noop"})
		if err != nil {
			b.Fatal(err)
		}
		noop := func(context.Context, pgx.Tx, []envelope.Event) error { return nil }
		ds := make([]inbox.Delivery, batch)
		for b.Loop() {
			for j := range ds {
				ev := testEvent()
				ev.MessageID = fmt.Sprintf("noop-%d", benchSeq.Add(1))
				ds[j] = inbox.Delivery{Event: ev}
			}
			if _, err := store.ProcessBatchWith(ctx, db.Pool, ds, noop); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "msgs/s")
	})
	b.Run("inbox+sql-handler-batch", func(b *testing.B) {
		h, err := NewSQL(SQLConfig{Function: db.Schema + ".apply_event"})
		if err != nil {
			b.Fatal(err)
		}
		store, err := inbox.NewStore(inbox.StoreConfig{Schema: db.Schema, Consumer: "bench"})
		if err != nil {
			b.Fatal(err)
		}
		ds := make([]inbox.Delivery, batch)
		for b.Loop() {
			for j := range ds {
				ev := testEvent()
				ev.MessageID = fmt.Sprintf("inbox-%d", benchSeq.Add(1))
				ds[j] = inbox.Delivery{Event: ev}
			}
			res, err := store.ProcessBatchWith(ctx, db.Pool, ds, h.HandleBatch)
			if err != nil || res[batch-1].Outcome != inbox.Processed {
				b.Fatalf("process batch: %v", err)
			}
		}
		b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "msgs/s")
	})
}
