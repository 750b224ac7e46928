package events_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/events"
	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/outbox"
)

// TestProducerIdentityGolden pins keiro's frozen vector (ADR: source "ordering", name
// "ordering-integration-producer", event 00000000-0000-0000-0000-000000000001, index 0,
// namespace "msg") and the canonical bytes, written out by hand from the spec.
func TestProducerIdentityGolden(t *testing.T) {
	id, err := envelope.ParseUUID("00000000-0000-0000-0000-000000000001")
	require.NoError(t, err)
	want := strings.Join([]string{
		"0000000000000015", hex.EncodeToString([]byte("keiro.producer.outbox")),
		"0000000000000002", "0001",
		"0000000000000008", hex.EncodeToString([]byte("ordering")),
		"000000000000001d", hex.EncodeToString([]byte("ordering-integration-producer")),
		"0000000000000010", "00000000000000000000000000000001",
		"0000000000000004", "00000000",
	}, "")
	require.Equal(t, want, hex.EncodeToString(events.ProducerIdentityBytes("ordering", "ordering-integration-producer", id, 0)))

	got := events.NewProducerIdentity("msg", "ordering", "ordering-integration-producer", id, 0)
	require.Equal(t, "61dd62b4bbfef1ce56346ce6afd485172774bc060102e5cf455e39bd0edfa84b", hex.EncodeToString(got.Digest[:]))
	require.Equal(t, "61dd62b4-bbfe-81ce-9634-6ce6afd48517", got.OutboxID.String())
	require.Equal(t, "msg_v1_61dd62b4bbfef1ce56346ce6afd485172774bc060102e5cf455e39bd0edfa84b", got.MessageID)
	raw, _ := hex.DecodeString(want)
	require.Equal(t, sha256.Sum256(raw), got.Digest)

	// Every input is part of the identity, except the prefix, which is outside the hash.
	other := events.NewProducerIdentity("evt", "ordering", "ordering-integration-producer", id, 0)
	require.Equal(t, got.OutboxID, other.OutboxID)
	require.NotEqual(t, got.MessageID, other.MessageID)
	for _, d := range []events.ProducerIdentity{
		events.NewProducerIdentity("msg", "billing", "ordering-integration-producer", id, 0),
		events.NewProducerIdentity("msg", "ordering", "other", id, 0),
		events.NewProducerIdentity("msg", "ordering", "ordering-integration-producer", envelope.UUID{}, 0),
		events.NewProducerIdentity("msg", "ordering", "ordering-integration-producer", id, 1),
	} {
		require.NotEqual(t, got.Digest, d.Digest)
	}
	require.NoError(t, events.ValidateMessageIDPrefix("msg"))
	for _, bad := range []string{"", "Bad-Prefix", "msg_x", strings.Repeat("a", 64), "é"} {
		require.ErrorIs(t, events.ValidateMessageIDPrefix(bad), events.ErrInvalidMessageIDPrefix, bad)
	}
}

// TestProducerIdentityGoldenVectors pins more vectors of keiro's identity v1, computed
// independently of this package from the algorithm (SHA-256 over the length-prefixed fields,
// UUIDv8 bits on the first 16 bytes): another source, name, prefix and index, and non-ASCII
// inputs with the largest index.
func TestProducerIdentityGoldenVectors(t *testing.T) {
	for _, v := range []struct {
		prefix, source, name, event string
		index                       uint32
		digest, outboxID            string
	}{
		{"evt", "billing", "billing-producer", "018f0f18-17aa-7000-8000-0000000000aa", 3,
			"bc64f9025e733ca80a8f8ead093187fcc99ee619da0068cdd251c26067500b4c", "bc64f902-5e73-8ca8-8a8f-8ead093187fc"},
		{"msg", "zaïre-ü", "名前", "ffffffff-ffff-ffff-ffff-ffffffffffff", 4294967295,
			"5c90128bd04e4215d996c9cc5cdfffc4959444ac79221d2a105d0542a53050c0", "5c90128b-d04e-8215-9996-c9cc5cdfffc4"},
	} {
		id, err := envelope.ParseUUID(v.event)
		require.NoError(t, err)
		got := events.NewProducerIdentity(v.prefix, v.source, v.name, id, v.index)
		require.Equal(t, v.digest, hex.EncodeToString(got.Digest[:]))
		require.Equal(t, v.outboxID, got.OutboxID.String())
		require.Equal(t, v.prefix+"_v1_"+v.digest, got.MessageID)
	}
}

func orderMapper(version string) events.MapFunc {
	return func(e events.RecordedEvent) ([]envelope.Event, error) {
		if e.Type != "Placed" {
			return nil, nil
		}
		key := e.StreamName
		out := []envelope.Event{{
			Destination: "ordering.orders.v1", Key: &key, EventType: "OrderPlaced", SchemaVersion: 1,
			ContentType: envelope.ContentTypeJSON, Payload: []byte(`{"v":"` + version + `","data":` + string(e.Data) + `}`),
		}}
		if strings.Contains(string(e.Data), "audit") {
			out = append(out, envelope.Event{Destination: "ordering.audit.v1", EventType: "Audited", SchemaVersion: 1,
				ContentType: envelope.ContentTypeJSON, Payload: []byte(`{}`)})
		}
		return out, nil
	}
}

type outboxRow struct {
	MessageID, Destination  string
	OutboxID, SourceEventID envelope.UUID
	Position                *int64
}

func outboxRows(t testing.TB, db *testenv.DB) []outboxRow {
	rows, err := db.Pool.Query(context.Background(), fmt.Sprintf(
		`SELECT message_id, destination, outbox_id, source_event_id, source_global_position FROM %s.keiro_outbox ORDER BY seq`, db.Schema))
	require.NoError(t, err)
	var out []outboxRow
	for rows.Next() {
		var r outboxRow
		var oid, id [16]byte
		require.NoError(t, rows.Scan(&r.MessageID, &r.Destination, &oid, &id, &r.Position))
		r.OutboxID, r.SourceEventID = envelope.UUID(oid), envelope.UUID(id)
		out = append(out, r)
	}
	require.NoError(t, rows.Err())
	return out
}

func TestProducerEnqueuesDeterministically(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	tm := newTelemetry()
	s := newStore(t, db)
	ob, err := outbox.NewStore(db.Schema)
	require.NoError(t, err)
	ctx := context.Background()

	var placed []events.AppendResult
	for i := range 6 {
		data := fmt.Sprintf(`{"n":%d}`, i)
		if i == 3 {
			data = `{"n":3,"audit":true}`
		}
		res, err := appendTx(t, db, s, fmt.Sprintf("order-%d", i), events.NoStream, ev("Placed", data), ev("Noted", `{}`))
		require.NoError(t, err)
		placed = append(placed, res)
	}
	h := head(t, s, db)
	p := new(testenv.Progress)
	cfg := events.ProducerConfig{Name: "ordering-integration-producer", Source: "ordering", MessageIDPrefix: "msg",
		Map: orderMapper("1"), Outbox: ob, AfterCommit: p.Set, BatchSize: 4, MeterProvider: tm.mp}
	prod, err := events.NewProducer(s, db.Pool, cfg)
	require.NoError(t, err)
	stop, errc := runSub(t, prod.Subscription())
	p.Wait(t, h, time.Minute, errc)
	stop()

	first := outboxRows(t, db)
	require.Len(t, first, 7)
	byID := map[string]outboxRow{}
	for _, r := range first {
		byID[r.MessageID] = r
	}
	for _, res := range placed {
		e := res.Events[0]
		ident := events.NewProducerIdentity("msg", "ordering", cfg.Name, e.ID, 0)
		r, ok := byID[ident.MessageID]
		require.True(t, ok, "message id of %s derived from (producer, event id, 0)", e.StreamName)
		require.Equal(t, ident.OutboxID, r.OutboxID, "the row id is keiro's UUIDv8 of the identity")
		require.Equal(t, e.ID, r.SourceEventID)
		require.Equal(t, e.GlobalPosition, *r.Position)
	}
	audit := events.NewProducerIdentity("msg", "ordering", cfg.Name, placed[3].Events[0].ID, 1).MessageID
	require.Equal(t, "ordering.audit.v1", byID[audit].Destination)

	// Replay from zero with Republish: duplicates only, no new rows, same ids.
	require.NoError(t, prod.Subscription().Rebuild(ctx, nil))
	p2 := new(testenv.Progress)
	cfg.AfterCommit, cfg.Republish = p2.Set, true
	again, err := events.NewProducer(s, db.Pool, cfg)
	require.NoError(t, err)
	stop, errc = runSub(t, again.Subscription())
	p2.Wait(t, h, time.Minute, errc)
	stop()
	require.Equal(t, first, outboxRows(t, db))

	// A changed mapper replaying history with Republish meets the retained rows: the batch
	// rolls back and the producer stops with a clear error; the checkpoint does not move.
	require.NoError(t, prod.Subscription().Rebuild(ctx, nil))
	cfg.Map, cfg.AfterCommit, cfg.Republish = orderMapper("2"), nil, true
	changed, err := events.NewProducer(s, db.Pool, cfg)
	require.NoError(t, err)
	err = changed.Run(ctx)
	require.ErrorIs(t, err, outbox.ErrIdentityConflict)
	require.ErrorContains(t, err, "did the mapper change")
	pos, err := changed.Subscription().Position(ctx)
	require.NoError(t, err)
	require.Zero(t, pos)
	require.Equal(t, first, outboxRows(t, db))
	require.Positive(t, tm.counter(t, "keiro.outbox.identity.conflict"))
}

// TestProducerReplayBeyondRetention: after the relay's retention (shortened to a microsecond)
// deleted the sent rows, a replay enqueues nothing and reports what it skipped; with Republish
// it publishes history again, under the same ids.
func TestProducerReplayBeyondRetention(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	tm := newTelemetry()
	s := newStore(t, db)
	ob, err := outbox.NewStore(db.Schema)
	require.NoError(t, err)
	ctx := context.Background()
	for i := range 3 {
		_, err := appendTx(t, db, s, fmt.Sprintf("order-%d", i), events.NoStream, ev("Placed", `{}`))
		require.NoError(t, err)
	}
	h := head(t, s, db)
	run := func(cfg events.ProducerConfig) {
		p := new(testenv.Progress)
		cfg.AfterCommit = p.Set
		prod, err := events.NewProducer(s, db.Pool, cfg)
		require.NoError(t, err)
		stop, errc := runSub(t, prod.Subscription())
		p.Wait(t, h, time.Minute, errc)
		stop()
	}
	cfg := events.ProducerConfig{Name: "ordering-producer", Source: "ordering", MessageIDPrefix: "msg",
		Map: orderMapper("1"), Outbox: ob, MeterProvider: tm.mp}
	run(cfg)
	first := outboxRows(t, db)
	require.Len(t, first, 3)

	// The relay published them and its retention, shortened, deleted them.
	_, err = db.Pool.Exec(ctx, `UPDATE keiro_outbox SET status = 'sent', published_at = now() - interval '1 second'`)
	require.NoError(t, err)
	kc := testenv.NewKafka(t)
	relay, err := outbox.NewRelay(db.Pool, kc.NewClient(t, outbox.ProducerOpts()...), outbox.RelayConfig{Schema: db.Schema, Retention: time.Microsecond})
	require.NoError(t, err)
	res, err := relay.MaintenancePass(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(3), res.Deleted)

	// A rebuild replays history: nothing is enqueued again; the skip is counted.
	prod, err := events.NewProducer(s, db.Pool, cfg)
	require.NoError(t, err)
	require.NoError(t, prod.Subscription().Rebuild(ctx, nil))
	run(cfg)
	require.Empty(t, outboxRows(t, db))
	require.Equal(t, int64(3), tm.counter(t, "keiro.producer.replay.skipped"))

	// Republish, on purpose: the same ids again.
	require.NoError(t, prod.Subscription().Rebuild(ctx, nil))
	cfg.Republish = true
	run(cfg)
	require.Equal(t, first, outboxRows(t, db))
}

// TestProducerDeadLetterAndReplay: a mapper error dead-letters its event at once (the mapper is
// deterministic) while later events are enqueued; once the mapper is fixed, a replay enqueues
// it, although the producer's mark has moved past it.
func TestProducerDeadLetterAndReplay(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	s := newStore(t, db)
	ob, err := outbox.NewStore(db.Schema)
	require.NoError(t, err)
	ctx := context.Background()
	for i := range 3 {
		_, err := appendTx(t, db, s, fmt.Sprintf("order-%d", i), events.NoStream, ev("Placed", `{}`))
		require.NoError(t, err)
	}
	h := head(t, s, db)
	var broken atomic.Bool
	broken.Store(true)
	good := orderMapper("1")
	p := new(testenv.Progress)
	prod, err := events.NewProducer(s, db.Pool, events.ProducerConfig{Name: "p", Source: "ordering", MessageIDPrefix: "msg",
		Outbox: ob, AfterCommit: p.Set, Map: func(e events.RecordedEvent) ([]envelope.Event, error) {
			if e.StreamName == "order-1" && broken.Load() {
				return nil, errors.New("no mapping for order-1")
			}
			return good(e)
		}})
	require.NoError(t, err)
	_, errc := runSub(t, prod.Subscription())
	p.Wait(t, h, time.Minute, errc)
	require.Len(t, outboxRows(t, db), 2)
	dead, err := s.ListDeadLetters(ctx, db.Pool, events.DeadLetterFilter{Subscription: "p"})
	require.NoError(t, err)
	require.Len(t, dead, 1)
	require.Equal(t, events.ErrorClassPermanent, dead[0].ErrorClass)
	require.Equal(t, 1, dead[0].Attempts)

	broken.Store(false)
	p.Set(0)
	_, err = s.RequestReplay(ctx, db.Pool, "p")
	require.NoError(t, err)
	p.Wait(t, h, time.Minute, errc)
	rows := outboxRows(t, db)
	require.Len(t, rows, 3)
	require.Equal(t, dead[0].EventID, rows[2].SourceEventID)
}

func TestProducerThroughCommandHook(t *testing.T) {
	// The other way to feed the outbox: enqueue in the command's own transaction.
	t.Parallel()
	db := testenv.NewDB(t)
	ob, err := outbox.NewStore(db.Schema)
	require.NoError(t, err)
	s, r := newCounterRunner(t, db, nil, events.RunnerConfig[counterState]{Hooks: []events.Hook{
		func(ctx context.Context, tx pgx.Tx, res events.Result) error {
			for i, e := range res.Events {
				id := events.NewProducerIdentity("msg", "counting", "inline", e.ID, uint32(i))
				_, err := ob.EnqueueTx(ctx, tx, envelope.Event{MessageID: id.MessageID, Source: "counting",
					Destination: "counting.v1", EventType: "Added", ContentType: envelope.ContentTypeJSON,
					Payload: e.Data, OccurredAt: e.RecordedAt, SourceEventID: &e.ID})
				if err != nil {
					return err
				}
			}
			return nil
		}}})
	_, err = r.Run(context.Background(), db.Pool, "counter-1", counterCmd{N: 1})
	require.NoError(t, err)
	require.Len(t, outboxRows(t, db), 1)
	_ = s
}

func TestProducerConfigAndMapperErrors(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	s := newStore(t, db)
	_, err := events.NewProducer(s, db.Pool, events.ProducerConfig{MessageIDPrefix: "Bad-Prefix"})
	for _, f := range []string{"Name", "Source", "MessageIDPrefix", "Map", "Outbox"} {
		require.ErrorContains(t, err, f)
	}
	ob, err := outbox.NewStore(db.Schema)
	require.NoError(t, err)
	base := events.ProducerConfig{Name: "p", Source: "ordering", MessageIDPrefix: "msg", Outbox: ob}
	rec := events.RecordedEvent{ID: envelope.NewUUIDv7(), GlobalPosition: 9, StreamName: "order-1", Type: "Placed", Data: json.RawMessage(`{}`), RecordedAt: time.Now()}
	for name, m := range map[string]events.MapFunc{
		"sets MessageID": func(events.RecordedEvent) ([]envelope.Event, error) {
			return []envelope.Event{{MessageID: "x"}}, nil
		},
		"has source": func(events.RecordedEvent) ([]envelope.Event, error) {
			return []envelope.Event{{Source: "billing"}}, nil
		},
		"boom": func(events.RecordedEvent) ([]envelope.Event, error) { return nil, fmt.Errorf("boom") },
	} {
		cfg := base
		cfg.Map = m
		p, err := events.NewProducer(s, db.Pool, cfg)
		require.NoError(t, err)
		_, err = p.Events(rec)
		require.ErrorContains(t, err, name)
	}
	cfg := base
	cfg.Map = orderMapper("1")
	p, err := events.NewProducer(s, db.Pool, cfg)
	require.NoError(t, err)
	out, err := p.Events(rec)
	require.NoError(t, err)
	require.Len(t, out, 1)
	require.Equal(t, "ordering", out[0].Source)
	require.Equal(t, rec.ID, *out[0].SourceEventID)
	require.Equal(t, rec.ID, *out[0].CausationID)
	require.Equal(t, int64(9), *out[0].SourceGlobalPosition)
	require.NoError(t, out[0].Validate())
}
