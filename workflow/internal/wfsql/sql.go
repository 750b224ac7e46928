// Package wfsql holds every SQL statement of the workflow package, as whole statements over the
// {{schema}} placeholder, replaced once by New with a validated schema name.
package wfsql

import (
	"strings"

	"github.com/keiro-go/keiro/internal/advisorylock"
)

// Queries are the workflow statements for one schema.
type Queries struct {
	Start, Claim, ClaimOne, LoadJournal, LockStep, LookupStep, InsertStep, RecordStep string
	Complete, Suspend, Fail, Retry, Rotate, DeleteGeneration, Wake, Notify, Instance  string
	Cancel, CancelAwakeables, ParentOf, Generation, InsertAwakeable, ResolveAwakeable string
	AwakeableGet, Gauges, GC, ChildStepInsert, StepsOf, Release                       string
	LoadFromSnapshot, JournalRange, SnapshotRead, SnapshotWrite                       string
}

// New returns the statements for schema (already validated as a plain identifier).
func New(schema string) Queries {
	r := strings.NewReplacer("{{schema}}", schema)
	q := Queries{
		Start:            sqlStart,
		Claim:            sqlClaim,
		ClaimOne:         sqlClaimOne,
		LoadJournal:      sqlLoadJournal,
		LockStep:         sqlLockStep,
		LookupStep:       sqlLookupStep,
		InsertStep:       sqlInsertStep,
		RecordStep:       sqlRecordStep,
		Complete:         sqlComplete,
		Suspend:          sqlSuspend,
		Fail:             sqlFail,
		Retry:            sqlRetry,
		Rotate:           sqlRotate,
		DeleteGeneration: sqlDeleteGeneration,
		Wake:             sqlWake,
		Notify:           sqlNotify,
		Instance:         sqlInstance,
		Cancel:           sqlCancel,
		CancelAwakeables: sqlCancelAwakeables,
		ParentOf:         sqlParentOf,
		Generation:       sqlGeneration,
		InsertAwakeable:  sqlInsertAwakeable,
		ResolveAwakeable: sqlResolveAwakeable,
		AwakeableGet:     sqlAwakeableGet,
		Gauges:           sqlGauges,
		GC:               sqlGC,
		ChildStepInsert:  sqlInsertStep,
		StepsOf:          sqlStepsOf,
		Release:          sqlRelease,
		LoadFromSnapshot: sqlLoadFromSnapshot,
		JournalRange:     sqlJournalRange,
		SnapshotRead:     sqlSnapshotRead,
		SnapshotWrite:    sqlSnapshotWrite,
	}
	for _, p := range []*string{&q.Start, &q.Claim, &q.ClaimOne, &q.LoadJournal, &q.LockStep, &q.LookupStep,
		&q.InsertStep, &q.RecordStep, &q.Complete, &q.Suspend, &q.Fail, &q.Retry, &q.Rotate, &q.DeleteGeneration,
		&q.Wake, &q.Notify, &q.Instance, &q.Cancel, &q.CancelAwakeables, &q.ParentOf, &q.Generation,
		&q.InsertAwakeable, &q.ResolveAwakeable, &q.AwakeableGet, &q.Gauges, &q.GC, &q.ChildStepInsert,
		&q.StepsOf, &q.Release, &q.LoadFromSnapshot, &q.JournalRange, &q.SnapshotRead, &q.SnapshotWrite} {
		*p = r.Replace(*p)
	}
	return q
}

// sqlStart inserts an instance, runnable at once ($1 name, $2 id, $3 input, $4 parent name,
// $5 parent id, $6 now). An existing instance is left alone: it returns no row.
const sqlStart = `INSERT INTO {{schema}}.keiro_workflows
    (workflow_name, workflow_id, input, parent_name, parent_id, wake_after, created_at, updated_at)
VALUES ($1, $2, $3, $4, $5, $6, $6, $6)
ON CONFLICT (workflow_name, workflow_id) DO NOTHING
RETURNING workflow_id`

// sqlClaim leases up to $3 runnable instances of the registered names $4 for owner $1 until
// $5, at the worker's clock $2: due, live, and not leased by a live owner. It counts the
// attempt.
const sqlClaim = `WITH c AS (
    SELECT workflow_name, workflow_id FROM {{schema}}.keiro_workflows
    WHERE status IN ('pending', 'running', 'suspended') AND wake_after IS NOT NULL AND wake_after <= $2
      AND (lease_until IS NULL OR lease_until <= $2) AND workflow_name = ANY($4)
    ORDER BY wake_after
    LIMIT $3
    FOR UPDATE SKIP LOCKED)
UPDATE {{schema}}.keiro_workflows AS w
SET status = 'running', lease_owner = $1, lease_until = $5, attempts = w.attempts + 1, updated_at = $2
FROM c WHERE w.workflow_name = c.workflow_name AND w.workflow_id = c.workflow_id
RETURNING w.workflow_name, w.workflow_id, w.generation, w.input, w.attempts, w.wakes, w.journal_version`

// sqlClaimOne leases one named instance ($3 name, $4 id) for owner $1 until $5 at clock $2,
// whatever its wake time, unless it is terminal or leased by another live owner.
const sqlClaimOne = `UPDATE {{schema}}.keiro_workflows AS w
SET status = 'running', lease_owner = $1, lease_until = $5, attempts = w.attempts + 1, updated_at = $2
WHERE w.workflow_name = $3 AND w.workflow_id = $4 AND w.status IN ('pending', 'running', 'suspended')
  AND (w.lease_until IS NULL OR w.lease_until <= $2 OR w.lease_owner = $1)
RETURNING w.workflow_name, w.workflow_id, w.generation, w.input, w.attempts, w.wakes, w.journal_version`

// sqlLoadJournal reads one generation's recorded steps with their versions.
const sqlLoadJournal = `SELECT step_name, result, version FROM {{schema}}.keiro_workflow_steps
WHERE workflow_name = $1 AND workflow_id = $2 AND generation = $3`

// sqlLoadFromSnapshot reads, in one statement (one database snapshot), the instance's advisory
// snapshot of generation $3 when its codec is $4 and its shape $5 (a row whose step name is
// NULL: the encoded step map and its journal version), then the generation's steps above that
// version (every step when there is none).
const sqlLoadFromSnapshot = `WITH s AS (
    SELECT journal_version, state FROM {{schema}}.keiro_workflow_snapshots
    WHERE workflow_name = $1 AND workflow_id = $2 AND generation = $3 AND state_version = $4 AND shape_hash = $5)
SELECT NULL::text, s.state, s.journal_version FROM s
UNION ALL
SELECT step_name, result, version FROM {{schema}}.keiro_workflow_steps
WHERE workflow_name = $1 AND workflow_id = $2 AND generation = $3
  AND version > COALESCE((SELECT journal_version FROM s), -1)`

// sqlJournalRange reads the steps of generation $3 whose versions lie in ($4, $5].
const sqlJournalRange = `SELECT step_name, result, version FROM {{schema}}.keiro_workflow_steps
WHERE workflow_name = $1 AND workflow_id = $2 AND generation = $3 AND version > $4 AND version <= $5`

// sqlLockStep serialises the writers of one step until their transactions end.
var sqlLockStep = `SELECT pg_advisory_xact_lock(` + advisorylock.WorkflowStep("$1", "$2", "($3::int)::text", "$4") + `)`

// sqlLookupStep reads one recorded step.
const sqlLookupStep = `SELECT result FROM {{schema}}.keiro_workflow_steps
WHERE workflow_name = $1 AND workflow_id = $2 AND generation = $3 AND step_name = $4`

// sqlInsertStep records a step at the instance's next journal version unless it is recorded;
// it returns a row only when it wrote. It takes the instance row's lock before the step's key,
// as sqlRecordStep does, so the two never wait on each other in opposite orders.
const sqlInsertStep = `WITH v AS (
    UPDATE {{schema}}.keiro_workflows SET journal_version = journal_version + 1
    WHERE workflow_name = $1 AND workflow_id = $2
    RETURNING journal_version)
INSERT INTO {{schema}}.keiro_workflow_steps (workflow_name, workflow_id, generation, step_name, result, version)
SELECT $1, $2, $3, $4, $5, v.journal_version FROM v
ON CONFLICT DO NOTHING
RETURNING step_name`

// sqlRecordStep records a run's step ($4 name, $5 result) and its progress on the live
// instance ($3 generation): the next journal version, attempts reset, the lease of owner $6
// extended to $7. It returns whether the step was inserted (false: another writer recorded it
// first), whether the instance is still live on that generation (false: cancelled, ended or
// rotated; nothing is recorded) and the step's journal version.
const sqlRecordStep = `WITH progress AS (
    UPDATE {{schema}}.keiro_workflows
    SET attempts = 0, updated_at = now(), journal_version = journal_version + 1,
        lease_until = CASE WHEN lease_owner = $6 THEN $7 ELSE lease_until END
    WHERE workflow_name = $1 AND workflow_id = $2 AND generation = $3
      AND status IN ('pending', 'running', 'suspended')
    RETURNING journal_version),
ins AS (
    INSERT INTO {{schema}}.keiro_workflow_steps (workflow_name, workflow_id, generation, step_name, result, version)
    SELECT $1, $2, $3, $4, $5, p.journal_version FROM progress p
    ON CONFLICT DO NOTHING
    RETURNING version)
SELECT EXISTS (SELECT 1 FROM ins), EXISTS (SELECT 1 FROM progress), COALESCE((SELECT version FROM ins), 0)`

// sqlComplete finishes a live instance with its result, returning its parent and its journal
// version. A terminal row is never resurrected.
const sqlComplete = `UPDATE {{schema}}.keiro_workflows
SET status = $4, result = $5, last_error = $6, completed_at = now(), updated_at = now(),
    lease_owner = NULL, lease_until = NULL, wake_after = NULL
WHERE workflow_name = $1 AND workflow_id = $2 AND generation = $3
  AND status IN ('pending', 'running', 'suspended')
RETURNING parent_name, parent_id, journal_version`

// sqlSuspend parks a run: it gives up the lease of owner $4 and sets the wake time $6, unless a
// wake source came after the run's claim ($5: the wakes it saw), which keeps it runnable.
const sqlSuspend = `UPDATE {{schema}}.keiro_workflows
SET status = 'suspended', attempts = 0, updated_at = now(), lease_owner = NULL, lease_until = NULL,
    wake_after = CASE WHEN wakes = $5 THEN $6::timestamptz ELSE wake_after END
WHERE workflow_name = $1 AND workflow_id = $2 AND generation = $3
  AND status IN ('pending', 'running', 'suspended') AND (lease_owner IS NULL OR lease_owner = $4)`

// sqlFail ends a live instance as failed ($4 reason), returning its parent and its journal
// version.
const sqlFail = `UPDATE {{schema}}.keiro_workflows
SET status = 'failed', last_error = $4, completed_at = now(), updated_at = now(),
    lease_owner = NULL, lease_until = NULL, wake_after = NULL
WHERE workflow_name = $1 AND workflow_id = $2 AND generation = $3
  AND status IN ('pending', 'running', 'suspended')
RETURNING parent_name, parent_id, journal_version`

// sqlRetry records a failed run ($4 reason) and schedules the next attempt at $5; $6 refunds
// the run's attempt (1, for a transient database failure) or not (0).
const sqlRetry = `UPDATE {{schema}}.keiro_workflows
SET status = 'running', last_error = $4, wake_after = $5, updated_at = now(), lease_owner = NULL, lease_until = NULL,
    attempts = GREATEST(attempts - $6::int, 0)
WHERE workflow_name = $1 AND workflow_id = $2 AND generation = $3
  AND status IN ('pending', 'running', 'suspended')`

// sqlRotate moves a live instance to its next generation with a new input ($4), runnable at $5.
const sqlRotate = `UPDATE {{schema}}.keiro_workflows
SET generation = generation + 1, input = $4, status = 'pending', attempts = 0, last_error = NULL,
    wake_after = $5, wakes = wakes + 1, updated_at = now(), lease_owner = NULL, lease_until = NULL
WHERE workflow_name = $1 AND workflow_id = $2 AND generation = $3
  AND status IN ('pending', 'running', 'suspended')
RETURNING generation`

// sqlDeleteGeneration drops a finished generation's journal and its snapshot.
const sqlDeleteGeneration = `WITH snap AS (
    DELETE FROM {{schema}}.keiro_workflow_snapshots
    WHERE workflow_name = $1 AND workflow_id = $2 AND generation <= $3)
DELETE FROM {{schema}}.keiro_workflow_steps
WHERE workflow_name = $1 AND workflow_id = $2 AND generation = $3`

// sqlWake makes a live instance runnable now ($3) after a wake source resolved something it
// may await.
const sqlWake = `UPDATE {{schema}}.keiro_workflows
SET wakes = wakes + 1, wake_after = LEAST(COALESCE(wake_after, $3), $3), updated_at = now()
WHERE workflow_name = $1 AND workflow_id = $2 AND status IN ('pending', 'running', 'suspended')`

// sqlNotify wakes the workers listening on channel $1 when the transaction commits.
const sqlNotify = `SELECT pg_notify($1, '')`

// sqlInstance reads one instance.
const sqlInstance = `SELECT workflow_name, workflow_id, generation, status, input, result, COALESCE(last_error, ''),
    attempts, wake_after, lease_owner, lease_until, parent_name, parent_id, created_at, updated_at, completed_at
FROM {{schema}}.keiro_workflows WHERE workflow_name = $1 AND workflow_id = $2`

// sqlCancel cancels a live instance and its live descendants, returning each with its parent.
const sqlCancel = `WITH RECURSIVE tree AS (
    SELECT workflow_name, workflow_id FROM {{schema}}.keiro_workflows WHERE workflow_name = $1 AND workflow_id = $2
  UNION
    SELECT c.workflow_name, c.workflow_id FROM {{schema}}.keiro_workflows c
    JOIN tree t ON c.parent_name = t.workflow_name AND c.parent_id = t.workflow_id)
UPDATE {{schema}}.keiro_workflows AS w
SET status = 'cancelled', completed_at = now(), updated_at = now(), lease_owner = NULL, lease_until = NULL, wake_after = NULL
FROM tree
WHERE w.workflow_name = tree.workflow_name AND w.workflow_id = tree.workflow_id
  AND w.status IN ('pending', 'running', 'suspended')
RETURNING w.workflow_name, w.workflow_id, w.parent_name, w.parent_id`

// sqlCancelAwakeables cancels a cancelled instance's pending awakeables.
const sqlCancelAwakeables = `UPDATE {{schema}}.keiro_workflow_awakeables
SET status = 'cancelled', resolved_at = now()
WHERE workflow_name = $1 AND workflow_id = $2 AND status = 'pending'`

// sqlParentOf reads an instance's parent.
const sqlParentOf = `SELECT parent_name, parent_id FROM {{schema}}.keiro_workflows WHERE workflow_name = $1 AND workflow_id = $2`

// sqlGeneration reads an instance's generation and status.
const sqlGeneration = `SELECT generation, status FROM {{schema}}.keiro_workflows WHERE workflow_name = $1 AND workflow_id = $2`

// sqlInsertAwakeable registers a pending awakeable.
const sqlInsertAwakeable = `INSERT INTO {{schema}}.keiro_workflow_awakeables
    (awakeable_id, workflow_name, workflow_id, generation, step_name)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (awakeable_id) DO NOTHING`

// sqlResolveAwakeable resolves a pending awakeable ($2: completed, failed or cancelled).
const sqlResolveAwakeable = `UPDATE {{schema}}.keiro_workflow_awakeables
SET status = $2, resolved_at = now()
WHERE awakeable_id = $1 AND status = 'pending'
RETURNING workflow_name, workflow_id, generation, step_name`

// sqlAwakeableGet reads an awakeable.
const sqlAwakeableGet = `SELECT workflow_name, workflow_id, generation, step_name, status
FROM {{schema}}.keiro_workflow_awakeables WHERE awakeable_id = $1`

// sqlGauges counts, at clock $1, the pending awakeables, the due instances held by a live
// lease, and the due instances whose name is not among $2.
const sqlGauges = `SELECT
    (SELECT count(*) FROM {{schema}}.keiro_workflow_awakeables WHERE status = 'pending'),
    (SELECT count(*) FROM {{schema}}.keiro_workflows
        WHERE status IN ('pending', 'running', 'suspended') AND wake_after <= $1 AND lease_until > $1),
    (SELECT count(*) FROM {{schema}}.keiro_workflows
        WHERE status IN ('pending', 'running', 'suspended') AND wake_after <= $1 AND NOT (workflow_name = ANY($2)))`

// sqlGC deletes up to $2 instances finished before $1 whose parent is gone or finished, with
// their journals, awakeables and snapshots; it returns how many instances it deleted.
const sqlGC = `WITH doomed AS (
    SELECT w.workflow_name, w.workflow_id FROM {{schema}}.keiro_workflows w
    WHERE w.status IN ('completed', 'failed', 'cancelled') AND w.completed_at < $1
      AND NOT EXISTS (SELECT 1 FROM {{schema}}.keiro_workflows p
          WHERE p.workflow_name = w.parent_name AND p.workflow_id = w.parent_id
            AND p.status IN ('pending', 'running', 'suspended'))
    ORDER BY w.completed_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED),
steps AS (
    DELETE FROM {{schema}}.keiro_workflow_steps s USING doomed d
    WHERE s.workflow_name = d.workflow_name AND s.workflow_id = d.workflow_id),
awk AS (
    DELETE FROM {{schema}}.keiro_workflow_awakeables a USING doomed d
    WHERE a.workflow_name = d.workflow_name AND a.workflow_id = d.workflow_id),
snap AS (
    DELETE FROM {{schema}}.keiro_workflow_snapshots s USING doomed d
    WHERE s.workflow_name = d.workflow_name AND s.workflow_id = d.workflow_id)
DELETE FROM {{schema}}.keiro_workflows w USING doomed d
WHERE w.workflow_name = d.workflow_name AND w.workflow_id = d.workflow_id`

// sqlStepsOf lists an instance's recorded steps, every generation, in journal order.
const sqlStepsOf = `SELECT generation, step_name, result, recorded_at, version FROM {{schema}}.keiro_workflow_steps
WHERE workflow_name = $1 AND workflow_id = $2 ORDER BY generation, version, recorded_at, step_name`

// sqlRelease gives back a lease of owner $3 without recording a run.
const sqlRelease = `UPDATE {{schema}}.keiro_workflows
SET lease_owner = NULL, lease_until = NULL, updated_at = now()
WHERE workflow_name = $1 AND workflow_id = $2 AND lease_owner = $3`

// sqlSnapshotRead reads an instance's advisory snapshot, whatever its codec.
const sqlSnapshotRead = `SELECT generation, journal_version, state_version, shape_hash, state, updated_at
FROM {{schema}}.keiro_workflow_snapshots WHERE workflow_name = $1 AND workflow_id = $2`

// sqlSnapshotWrite keeps an instance's newest snapshot ($3 generation, $4 journal version, $5
// codec, $6 shape, $7 state): a row of another codec or shape is replaced whatever its version
// (so a rollback can re-seed), as the event store's snapshots are.
const sqlSnapshotWrite = `INSERT INTO {{schema}}.keiro_workflow_snapshots AS s
    (workflow_name, workflow_id, generation, journal_version, state_version, shape_hash, state)
VALUES ($1, $2, $3, $4, $5, $6, $7)
ON CONFLICT (workflow_name, workflow_id) DO UPDATE
SET generation = excluded.generation, journal_version = excluded.journal_version,
    state_version = excluded.state_version, shape_hash = excluded.shape_hash,
    state = excluded.state, updated_at = now()
WHERE s.journal_version <= excluded.journal_version
   OR s.state_version <> excluded.state_version OR s.shape_hash <> excluded.shape_hash`
