package workflow

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/keiro-go/keiro"
)

// The step-map codec of workflow snapshots (keiro's workflowStateCodec). A run uses a stored
// snapshot only when both match; bump them when the encoding changes, and runs read their
// journals in full until they write snapshots of the new kind.
const (
	// SnapshotShapeHash identifies the layout of a snapshot's state: a JSON object from step
	// name to the step's recorded JSON result.
	SnapshotShapeHash = "keiro.workflow.stepmap.v1"
	// SnapshotStateVersion is the version of the codec that writes that layout.
	SnapshotStateVersion = 1
)

type snapshotKind uint8

const (
	snapshotNever snapshotKind = iota
	snapshotEvery
	snapshotTerminal
)

// SnapshotPolicy decides when a run writes an advisory snapshot of its instance's journal
// (keiro's SnapshotPolicy for workflows): the accumulated step map of the generation at a
// journal version, from which the next run hydrates, reading only the steps recorded after it.
// The zero SnapshotPolicy is SnapshotNever.
type SnapshotPolicy struct {
	kind  snapshotKind
	every int64
}

// SnapshotNever writes no snapshot: every run reads its generation's whole journal (one
// indexed query). It is the default.
func SnapshotNever() SnapshotPolicy { return SnapshotPolicy{} }

// SnapshotEvery writes a snapshot after a run's step whose journal version crosses a multiple
// of n (n must be positive): a run of an instance with a long journal then reads the snapshot
// and fewer than n + (steps recorded meanwhile) rows.
func SnapshotEvery(n int64) SnapshotPolicy { return SnapshotPolicy{kind: snapshotEvery, every: n} }

// SnapshotOnTerminal writes one snapshot when a run ends the instance (completed or failed),
// at the journal version it ended at, so that a reader of a finished instance's step map
// (Engine.Snapshot) reads one row.
func SnapshotOnTerminal() SnapshotPolicy { return SnapshotPolicy{kind: snapshotTerminal} }

// String returns "never", "every <n>" or "on-terminal".
func (p SnapshotPolicy) String() string {
	switch p.kind {
	case snapshotEvery:
		return fmt.Sprintf("every %d", p.every)
	case snapshotTerminal:
		return "on-terminal"
	}
	return "never"
}

func (p SnapshotPolicy) validate() error {
	if p.kind == snapshotEvery && p.every <= 0 {
		return fmt.Errorf("SnapshotEvery(%d): n must be positive", p.every)
	}
	return nil
}

// afterStep reports whether a step that took the journal from version pre to post crosses a
// multiple of Every's n.
func (p SnapshotPolicy) afterStep(pre, post int64) bool {
	return p.kind == snapshotEvery && post/p.every > pre/p.every
}

// Snapshot is an instance's stored snapshot (a row of keiro_workflow_snapshots).
type Snapshot struct {
	// Generation is the generation whose journal it holds: a run uses it only while that is
	// the instance's generation.
	Generation int
	// JournalVersion is the journal version it was taken at: Steps holds every step of the
	// generation recorded at or below it.
	JournalVersion int64
	// Steps maps step names to their recorded JSON results.
	Steps map[string]json.RawMessage
	// UpdatedAt is when it was written.
	UpdatedAt time.Time
}

// Snapshot reads instance name/id's snapshot. ok is false when there is none a run would use:
// no row, or one of another codec version or shape hash, or one that does not decode.
func (e *Engine) Snapshot(ctx context.Context, q keiro.DB, name, id string) (s Snapshot, ok bool, err error) {
	var stateVersion int32
	var shape string
	var raw []byte
	err = q.QueryRow(ctx, e.q.SnapshotRead, name, id).Scan(&s.Generation, &s.JournalVersion, &stateVersion, &shape, &raw, &s.UpdatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return Snapshot{}, false, nil
	}
	if err != nil {
		return Snapshot{}, false, fmt.Errorf("read snapshot of workflow %s/%s: %w", name, id, err)
	}
	if stateVersion != SnapshotStateVersion || shape != SnapshotShapeHash {
		return Snapshot{}, false, nil
	}
	if s.Steps, err = decodeStepMap(raw); err != nil {
		return Snapshot{}, false, nil
	}
	return s, true, nil
}

// encodeStepMap encodes a step map as a snapshot's state: a JSON object (keys sorted) whose
// values are the steps' values as they were recorded, only compacted. json.Marshal would also
// rewrite <, > and & in them as \u003c, \u003e and \u0026 (HTML escaping): the same JSON
// values, but not the same bytes as the journal holds.
func encodeStepMap(m map[string]json.RawMessage) ([]byte, error) {
	if m == nil {
		m = map[string]json.RawMessage{}
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(m); err != nil {
		return nil, fmt.Errorf("encode step map: %w", err)
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

// decodeStepMap decodes a snapshot's state, which must be a JSON object.
func decodeStepMap(b []byte) (map[string]json.RawMessage, error) {
	if t := bytes.TrimLeft(b, " \t\r\n"); len(t) == 0 || t[0] != '{' {
		return nil, errors.New("decode step map: not a JSON object")
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("decode step map: %w", err)
	}
	return m, nil
}

// hydrate reads generation gen of instance name/id's journal: from its snapshot and the steps
// recorded after it when snapshots are on, else whole. It returns the step map and the journal
// version up to which the map holds every step (at least known, the version the run's claim
// saw: every step at or below it had committed).
func (e *Engine) hydrate(ctx context.Context, name, id string, gen int, known int64) (map[string]json.RawMessage, int64, error) {
	if e.cfg.Snapshot.kind == snapshotNever {
		return e.loadJournal(ctx, name, id, gen, known)
	}
	rows, err := e.db.Query(ctx, e.q.LoadFromSnapshot, name, id, gen, SnapshotStateVersion, SnapshotShapeHash)
	if err != nil {
		return nil, 0, fmt.Errorf("load journal of workflow %s/%s: %w", name, id, err)
	}
	journal := map[string]json.RawMessage{}
	var (
		step    *string
		v       json.RawMessage
		ver     int64
		seed    []byte
		hasSeed bool
		read    int64
	)
	if _, err := pgx.ForEachRow(rows, []any{&step, &v, &ver}, func() error {
		known = max(known, ver)
		if step == nil {
			seed, hasSeed = append([]byte(nil), v...), true
			return nil
		}
		journal[*step] = append(json.RawMessage(nil), v...)
		read++
		return nil
	}); err != nil {
		return nil, 0, fmt.Errorf("load journal of workflow %s/%s: %w", name, id, err)
	}
	if !hasSeed {
		e.tel.snapshotMisses.Add(ctx, 1)
		e.tel.journalRead.Record(ctx, read)
		return journal, known, nil
	}
	m, err := decodeStepMap(seed)
	if err != nil {
		e.tel.snapshotDecodeFailures.Add(ctx, 1)
		e.tel.snapshotMisses.Add(ctx, 1)
		e.cfg.Logger.WarnContext(ctx, "keiro: undecodable workflow snapshot; reading the whole journal", "workflow", name, "id", id, "error", err)
		return e.loadJournal(ctx, name, id, gen, known)
	}
	e.tel.snapshotHits.Add(ctx, 1)
	e.tel.journalRead.Record(ctx, read)
	for k, r := range m {
		if _, ok := journal[k]; !ok {
			journal[k] = r
		}
	}
	return journal, known, nil
}

// loadJournal reads generation gen's whole journal (see hydrate).
func (e *Engine) loadJournal(ctx context.Context, name, id string, gen int, known int64) (map[string]json.RawMessage, int64, error) {
	rows, err := e.db.Query(ctx, e.q.LoadJournal, name, id, gen)
	if err != nil {
		return nil, 0, fmt.Errorf("load journal of workflow %s/%s: %w", name, id, err)
	}
	journal := map[string]json.RawMessage{}
	var k string
	var v json.RawMessage
	var ver int64
	if _, err := pgx.ForEachRow(rows, []any{&k, &v, &ver}, func() error {
		journal[k] = append(json.RawMessage(nil), v...)
		known = max(known, ver)
		return nil
	}); err != nil {
		return nil, 0, fmt.Errorf("load journal of workflow %s/%s: %w", name, id, err)
	}
	e.tel.journalRead.Record(ctx, int64(len(journal)))
	return journal, known, nil
}

// recorded notes that the run recorded a step at journal version v, and writes a snapshot when
// the policy asks for one.
func (c *Context) recorded(v int64) {
	pre := c.version
	if v == pre+1 {
		c.version = v
	}
	if c.e.cfg.Snapshot.afterStep(pre, v) {
		c.writeSnapshot(c, v)
	}
}

// writeSnapshot writes the step map at journal version v, after the commit that reached it.
// Steps the run has not seen (recorded by wake sources) below v are read first. Failures are
// counted and logged, never returned: the snapshot is advisory and what it holds is committed.
func (c *Context) writeSnapshot(ctx context.Context, v int64) {
	ctx = context.WithoutCancel(ctx)
	if c.version < v {
		if err := c.fill(ctx, v); err != nil {
			c.e.tel.snapshotWriteFailures.Add(ctx, 1)
			c.e.cfg.Logger.WarnContext(ctx, "keiro: workflow snapshot not written; the step is committed", "workflow", c.def.name,
				"id", c.id, "version", v, "error", err)
			return
		}
	}
	raw, err := encodeStepMap(c.journal)
	if err != nil {
		c.e.tel.snapshotEncodeFailures.Add(ctx, 1)
		c.e.cfg.Logger.WarnContext(ctx, "keiro: workflow snapshot encode failed; the step is committed", "workflow", c.def.name,
			"id", c.id, "version", v, "error", err)
		return
	}
	if _, err := c.e.db.Exec(ctx, c.e.q.SnapshotWrite, c.def.name, c.id, c.gen, v, SnapshotStateVersion, SnapshotShapeHash, raw); err != nil {
		c.e.tel.snapshotWriteFailures.Add(ctx, 1)
		c.e.cfg.Logger.WarnContext(ctx, "keiro: workflow snapshot write failed; the step is committed", "workflow", c.def.name,
			"id", c.id, "version", v, "error", err)
	}
}

// fill reads the steps recorded between the run's known version and v into the journal.
func (c *Context) fill(ctx context.Context, v int64) error {
	rows, err := c.e.db.Query(ctx, c.e.q.JournalRange, c.def.name, c.id, c.gen, c.version, v)
	if err != nil {
		return fmt.Errorf("read journal versions (%d, %d]: %w", c.version, v, err)
	}
	var k string
	var r json.RawMessage
	var ver int64
	if _, err := pgx.ForEachRow(rows, []any{&k, &r, &ver}, func() error {
		c.journal[k] = append(json.RawMessage(nil), r...)
		return nil
	}); err != nil {
		return fmt.Errorf("read journal versions (%d, %d]: %w", c.version, v, err)
	}
	c.version = v
	return nil
}
