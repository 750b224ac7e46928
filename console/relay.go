package console

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/failure"
	"github.com/keiro-go/keiro/outbox"
)

// outboxStatuses are the row states in the order the pages show them.
var outboxStatuses = []string{"pending", "publishing", "failed", "sent", "dead", "rejected"}

// listableStatuses are the states /api/v1/outbox/rows lists: the rows an operator looks at.
var listableStatuses = []string{"dead", "rejected", "failed"}

// OutboxSummary answers GET /api/v1/outbox/summary.
type OutboxSummary struct {
	// Destinations has one entry per destination (topic), sorted by name.
	Destinations []DestinationSummary `json:"destinations"`
	// Totals is the row count per status over every destination.
	Totals map[string]int64 `json:"totals"`
	// Backlog counts the rows still to publish: pending, failed and publishing.
	Backlog int64 `json:"backlog"`
	// OldestPendingAgeSeconds is the age of the oldest pending or failed row; null when none.
	OldestPendingAgeSeconds *float64 `json:"oldest_pending_age_seconds"`
	// OldestPendingID is the outbox id of the row at the head of the queue: the unpublished row
	// (pending, failed or publishing) the relay claims first. Empty when none.
	OldestPendingID string `json:"oldest_pending_id,omitempty"`
	// DeadOrRejected counts the rows waiting for an operator, archived rows aside.
	DeadOrRejected int64 `json:"dead_or_rejected"`
	// Archived counts the dead and rejected rows an operator set aside, in neither Destinations,
	// Totals nor DeadOrRejected.
	Archived int64 `json:"archived"`
	// SentLastMinute counts the rows published in the last minute.
	SentLastMinute int64 `json:"sent_last_minute"`
	// FailedLastMinute counts the rows that went dead or rejected in the last minute.
	FailedLastMinute int64 `json:"failed_last_minute"`
	// RelaysConnected counts the relay processes of this outbox connected to the database (by
	// their application_name, "keiro-relay:SCHEMA@HOST/PID").
	RelaysConnected int64 `json:"relays_connected"`
	// LastHour has one bucket per minute of the last hour, oldest first: rows published and rows
	// gone dead or rejected (retained sent rows only: a retention under an hour shortens it).
	LastHour []RateBucket `json:"last_hour"`
	// ReadAt is the database's clock when the summary was read.
	ReadAt time.Time `json:"read_at"`
	// Mode is the outbox's mode, claim or log (docs/architecture.md, "Log mode"). In log mode
	// the counts above are those of keiro_outbox (the rows from before the switch, dead
	// letters and their requeues); the slot is the measure of what waits.
	Mode string `json:"mode"`
	// LogSlot is the log-mode replication slot (the schema's default slot, as `relay status`
	// reads it): its reader, confirmed position and the WAL it retains. Absent when the schema
	// has no such slot.
	LogSlot *outbox.SlotStatus `json:"log_slot,omitempty"`
	// LogSlots are every log-mode slot of the schema (outbox.Admin.LogSlots: one per
	// publication of keiro_outbox_log, with the destinations it gives its slot; several with
	// per-destination relays), in name order. Absent when there is none.
	LogSlots []outbox.SlotStatus `json:"log_slots,omitempty"`
	// ExactlyOnce is the exactly-once state of the relay whose process serves the console
	// (its transactional ids, transactions committed and aborted, fences, lost claims
	// recovered); absent without --exactly-once, or when the console runs elsewhere.
	ExactlyOnce *outbox.ExactlyOnceStatus `json:"exactly_once,omitempty"`
}

// DestinationSummary is one destination's row counts.
type DestinationSummary struct {
	// Destination is the topic.
	Destination string `json:"destination"`
	// Counts is the row count per status.
	Counts map[string]int64 `json:"counts"`
	// Backlog counts pending, failed and publishing rows.
	Backlog int64 `json:"backlog"`
	// OldestPendingAgeSeconds is the age of the destination's oldest pending or failed row.
	OldestPendingAgeSeconds *float64 `json:"oldest_pending_age_seconds"`
}

// RateBucket is one minute of the hour-long chart.
type RateBucket struct {
	// Minute is the bucket's start.
	Minute time.Time `json:"minute"`
	// Sent counts rows published (outbox) or completed (inbox) in the minute.
	Sent int64 `json:"sent"`
	// Failed counts rows that went dead or rejected (outbox) or failed (inbox) in the minute.
	Failed int64 `json:"failed"`
}

func (c *Console) readOutboxSummary(ctx context.Context) (OutboxSummary, error) {
	q := c.cfg.Outbox.Pool
	s := OutboxSummary{Totals: map[string]int64{}}
	var origin time.Time
	if err := q.QueryRow(ctx, bind(sqlOutboxRecent, c.cfg.Outbox.Schema, "keiro_outbox"), outbox.SchemaApplicationNamePrefix(c.cfg.Outbox.Schema)).Scan(
		&s.SentLastMinute, &s.FailedLastMinute, &s.RelaysConnected, &s.ReadAt, &origin); err != nil {
		return s, fmt.Errorf("read outbox summary: %w", err)
	}
	st, err := c.outbox.Overview(ctx, q)
	if err != nil {
		return s, fmt.Errorf("read outbox summary: %w", err)
	}
	s.Backlog, s.DeadOrRejected, s.Archived = st.Backlog, st.Dead, st.Archived
	byDest := map[string]*DestinationSummary{}
	for _, n := range st.Counts {
		d := byDest[n.Destination]
		if d == nil {
			d = &DestinationSummary{Destination: n.Destination, Counts: map[string]int64{}}
			byDest[n.Destination] = d
		}
		d.Counts[string(n.Status)] = n.Count
		s.Totals[string(n.Status)] += n.Count
		switch n.Status {
		case outbox.StatusPending, outbox.StatusFailed, outbox.StatusPublishing:
			d.Backlog += n.Count
		}
	}
	var oldest time.Time
	for _, first := range st.OldestPendingCreatedAt {
		if oldest.IsZero() || first.Before(oldest) {
			oldest = first
		}
	}
	for _, d := range byDest {
		d.OldestPendingAgeSeconds = ageSeconds(s.ReadAt, st.OldestPendingCreatedAt[d.Destination])
		s.Destinations = append(s.Destinations, *d)
	}
	sort.Slice(s.Destinations, func(i, j int) bool { return s.Destinations[i].Destination < s.Destinations[j].Destination })
	s.OldestPendingAgeSeconds = ageSeconds(s.ReadAt, oldest)
	if s.Backlog > 0 {
		head, err := c.outbox.ListOutbox(ctx, q, outbox.ListOptions{Statuses: []outbox.Status{outbox.StatusPending, outbox.StatusFailed, outbox.StatusPublishing}, Limit: 1,
			PayloadBytes: outbox.NoPayload})
		if err != nil {
			return s, fmt.Errorf("read outbox summary: %w", err)
		}
		if len(head) == 1 {
			s.OldestPendingID = head[0].OutboxID.String()
		}
	}
	minutes, err := c.outbox.Activity(ctx, q, origin, 60)
	if err != nil {
		return s, fmt.Errorf("read outbox summary: %w", err)
	}
	mode, err := c.outbox.Mode(ctx, q)
	if err != nil {
		return s, fmt.Errorf("read outbox summary: %w", err)
	}
	s.Mode = string(mode)
	slot, err := c.outbox.LogSlotStatus(ctx, q, "")
	if err != nil {
		return s, fmt.Errorf("read outbox summary: %w", err)
	}
	if slot.Exists {
		s.LogSlot = &slot
	}
	if s.LogSlots, err = c.outbox.LogSlots(ctx, q); err != nil {
		return s, fmt.Errorf("read outbox summary: %w", err)
	}
	if f := c.cfg.Outbox.ExactlyOnce; f != nil {
		if st, ok := f(); ok {
			s.ExactlyOnce = &st
		}
	}
	s.LastHour = make([]RateBucket, len(minutes))
	for i, m := range minutes {
		s.LastHour[i] = RateBucket{Minute: m.Start, Sent: m.Sent, Failed: m.Failed}
	}
	return s, nil
}

// OutboxRow is one outbox row in the API's lists and detail.
type OutboxRow struct {
	// OutboxID is the row's id, as requeue takes it.
	OutboxID string `json:"outbox_id"`
	// Seq is the row's place in the outbox's order.
	Seq int64 `json:"seq"`
	// Status is pending, publishing, sent, failed, dead or rejected.
	Status string `json:"status"`
	// Source, Destination, MessageID, Key and EventType identify the event.
	Source      string  `json:"source"`
	Destination string  `json:"destination"`
	MessageID   string  `json:"message_id"`
	Key         *string `json:"key"`
	EventType   string  `json:"event_type"`
	// Attempts is the number of publish attempts counted.
	Attempts int `json:"attempts"`
	// LastError is the last failure's text.
	LastError string `json:"last_error,omitempty"`
	// RejectionCode is the Kafka error of a rejected row ("message_too_large").
	RejectionCode string `json:"rejection_code,omitempty"`
	// AttemptHistory is the row's failed attempts, oldest first (the last 20); only in the
	// answer for one row.
	AttemptHistory []failure.Attempt `json:"attempt_history,omitempty"`
	// NextAttemptAt is when a failed row is retried.
	NextAttemptAt *time.Time `json:"next_attempt_at,omitempty"`
	// PublishedAt, Partition and Offset are set on sent rows.
	PublishedAt *time.Time `json:"published_at,omitempty"`
	Partition   *int32     `json:"partition,omitempty"`
	Offset      *int64     `json:"offset,omitempty"`
	// CreatedAt and UpdatedAt are the row's timestamps.
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
	// Headers are the Kafka headers the row is published with, in order.
	Headers []Header `json:"headers"`
	// Payload is the payload: a preview of DefaultPreviewBytes in lists, up to
	// DefaultDetailPayloadBytes in the detail.
	Payload Payload `json:"payload"`
}

// Requeueable reports whether requeue would move the row.
func (o OutboxRow) Requeueable() bool { return o.Status == "dead" || o.Status == "rejected" }

// OutboxPage answers GET /api/v1/outbox/rows.
type OutboxPage struct {
	// Rows are the rows of the page, newest first.
	Rows []OutboxRow `json:"rows"`
	// NextCursor continues the listing (?cursor=); empty on the last page.
	NextCursor string `json:"next_cursor,omitempty"`
}

// outboxFilter is a listing's query.
type outboxFilter struct {
	Statuses            []string
	Source, Destination string
	Before              int64
	Limit               int
	// Archived lists the archived rows instead of the working list.
	Archived bool
}

// statuses are the filter's statuses, as the outbox types them.
func (f outboxFilter) statuses() []outbox.Status {
	out := make([]outbox.Status, len(f.Statuses))
	for i, s := range f.Statuses {
		out[i] = outbox.Status(s)
	}
	return out
}

// ArchivedParam is the filter's ?archived= value: "true", or "" for the working list.
func (f outboxFilter) ArchivedParam() string { return archivedParam(f.Archived) }

func archivedParam(on bool) string {
	if on {
		return "true"
	}
	return ""
}

// parseArchived reads ?archived=: true or false (or absent: false).
func parseArchived(r *http.Request) (bool, error) {
	switch v := r.URL.Query().Get("archived"); v {
	case "", "false":
		return false, nil
	case "true":
		return true, nil
	default:
		return false, fmt.Errorf("archived must be true or false, got %q", v)
	}
}

// parseOutboxFilter reads ?status=&source=&destination=&cursor=&limit=.
func parseOutboxFilter(r *http.Request) (outboxFilter, error) {
	q := r.URL.Query()
	f := outboxFilter{Source: strings.TrimSpace(q.Get("source")), Destination: strings.TrimSpace(q.Get("destination"))}
	var errs []error
	for _, v := range q["status"] {
		for s := range strings.SplitSeq(v, ",") {
			switch s = strings.TrimSpace(s); {
			case s == "":
			case slices.Contains(listableStatuses, s):
				if !slices.Contains(f.Statuses, s) {
					f.Statuses = append(f.Statuses, s)
				}
			default:
				errs = append(errs, fmt.Errorf("status %q is not listable: use dead, rejected or failed", s))
			}
		}
	}
	if len(f.Statuses) == 0 {
		f.Statuses = []string{"dead", "rejected"}
	}
	if cur := q.Get("cursor"); cur != "" {
		n, err := strconv.ParseInt(cur, 10, 64)
		if err != nil || n < 1 {
			errs = append(errs, fmt.Errorf("cursor %q is not one this API returned: start again without it", cur))
		}
		f.Before = n
	}
	var err error
	if f.Limit, err = pageSize(r); err != nil {
		errs = append(errs, err)
	}
	if f.Archived, err = parseArchived(r); err != nil {
		errs = append(errs, err)
	}
	return f, errors.Join(errs...)
}

func (c *Console) listOutboxRows(ctx context.Context, f outboxFilter) (OutboxPage, error) {
	rows, err := c.outbox.ListOutbox(ctx, c.cfg.Outbox.Pool, outbox.ListOptions{Statuses: f.statuses(),
		Source: f.Source, Destination: f.Destination, NewestFirst: true, Before: f.Before, Limit: f.Limit + 1,
		Archived: f.Archived, PayloadBytes: DefaultPreviewBytes})
	if err != nil {
		return OutboxPage{}, err
	}
	page := OutboxPage{Rows: make([]OutboxRow, 0, len(rows))}
	for _, row := range rows {
		page.Rows = append(page.Rows, outboxRowOf(row, DefaultPreviewBytes))
	}
	if len(page.Rows) > f.Limit {
		page.Rows = page.Rows[:f.Limit]
		page.NextCursor = strconv.FormatInt(page.Rows[f.Limit-1].Seq, 10)
	}
	return page, nil
}

// outboxRowOf shows row with at most payloadBytes of its payload.
func outboxRowOf(row outbox.Row, payloadBytes int) OutboxRow {
	e := &row.Event
	o := OutboxRow{
		OutboxID: row.OutboxID.String(), Seq: row.Seq, Status: string(row.Status),
		Source: e.Source, Destination: e.Destination, MessageID: e.MessageID, Key: e.Key, EventType: e.EventType,
		Attempts: row.Attempts, LastError: row.LastError, RejectionCode: row.RejectionCode,
		PublishedAt: row.PublishedAt, Partition: row.Partition, Offset: row.Offset,
		CreatedAt: row.CreatedAt, UpdatedAt: row.UpdatedAt, Headers: headersOf(e),
		Payload: newPayload(e.Payload[:min(len(e.Payload), payloadBytes)], row.PayloadSize, e.ContentType),
	}
	if row.Status == "failed" || row.Status == "pending" {
		o.NextAttemptAt = &row.NextAttemptAt
	}
	return o
}

// errBadID reports an id that is not a UUID.
var errBadID = errors.New("not a UUID")

func (c *Console) getOutboxRow(ctx context.Context, raw string) (OutboxRow, error) {
	id, err := envelope.ParseUUID(raw)
	if err != nil {
		return OutboxRow{}, fmt.Errorf("outbox id %q: %w", raw, errBadID)
	}
	row, err := c.outbox.Lookup(ctx, c.cfg.Outbox.Pool, id)
	if err != nil {
		return OutboxRow{}, err
	}
	o := outboxRowOf(row, DefaultDetailPayloadBytes)
	if o.AttemptHistory, err = c.outbox.AttemptHistory(ctx, c.cfg.Outbox.Pool, id); err != nil {
		return OutboxRow{}, err
	}
	return o, nil
}

// RequeueRequest is the body of POST /api/v1/outbox/requeue: ids, or a source and/or
// destination filter, or all — exactly one way of selecting rows, as `relay dead requeue`.
type RequeueRequest struct {
	// IDs are outbox ids (UUIDs); at most MaxSelection.
	IDs []string `json:"ids,omitempty"`
	// Source requeues every dead or rejected row of this source (and Destination, if set).
	Source string `json:"source,omitempty"`
	// Destination requeues every dead or rejected row for this topic (and Source, if set).
	Destination string `json:"destination,omitempty"`
	// All requeues every dead and rejected row.
	All bool `json:"all,omitempty"`
}

// RequeueAnswer answers a requeue.
type RequeueAnswer struct {
	// Requeued lists the outbox ids moved back to pending, in seq order.
	Requeued []string `json:"requeued"`
	// Count is len(Requeued).
	Count int `json:"count"`
	// Skipped lists named ids that were not requeued and why ("no such row", or the status).
	Skipped []SkippedRow `json:"skipped,omitempty"`
	// Warning is the ordering caveat of every requeue.
	Warning string `json:"warning"`
}

// SkippedRow is a named row a requeue did not move.
type SkippedRow struct {
	// ID is the outbox id.
	ID string `json:"id"`
	// Reason is "no such row" or the row's status.
	Reason string `json:"reason"`
}

// filter validates the request into the outbox's filter.
func (q RequeueRequest) filter() (outbox.RequeueFilter, error) {
	var f outbox.RequeueFilter
	var errs []error
	modes := 0
	for _, on := range []bool{len(q.IDs) > 0, q.Source != "" || q.Destination != "", q.All} {
		if on {
			modes++
		}
	}
	switch {
	case modes == 0:
		errs = append(errs, errors.New("say which rows: ids, source and/or destination, or all"))
	case modes > 1:
		errs = append(errs, errors.New("choose one of: ids, source/destination, all"))
	}
	if len(q.IDs) > MaxSelection {
		errs = append(errs, fmt.Errorf("at most %d ids per request, got %d: use a source/destination filter or several requests", MaxSelection, len(q.IDs)))
	}
	for _, s := range q.IDs {
		id, err := envelope.ParseUUID(s)
		if err != nil {
			errs = append(errs, fmt.Errorf("id %q is not a UUID", s))
			continue
		}
		if !slices.Contains(f.IDs, id) {
			f.IDs = append(f.IDs, id)
		}
	}
	f.Source, f.Destination, f.All = q.Source, q.Destination, q.All
	return f, errors.Join(errs...)
}

// requeue runs outbox.Admin.RequeueTx in one transaction and logs who requeued what.
func (c *Console) requeue(r *http.Request, q RequeueRequest) (RequeueAnswer, error) {
	ans := RequeueAnswer{Requeued: []string{}, Warning: outbox.RequeueWarning}
	f, err := q.filter()
	if err != nil {
		return ans, err
	}
	var res outbox.RequeueResult
	err = pgx.BeginFunc(r.Context(), c.cfg.Outbox.Pool, func(tx pgx.Tx) error {
		var err error
		res, err = c.outbox.RequeueTx(r.Context(), tx, f)
		return err
	})
	if err != nil {
		c.action(r, "outbox requeue failed", "ids", q.IDs, "source", q.Source, "destination", q.Destination, "all", q.All, "err", err)
		return ans, err
	}
	for _, id := range res.Requeued {
		ans.Requeued = append(ans.Requeued, id.String())
	}
	for _, s := range res.Skipped {
		ans.Skipped = append(ans.Skipped, SkippedRow{ID: s.ID.String(), Reason: s.Reason})
	}
	ans.Count = len(ans.Requeued)
	c.action(r, "outbox requeue", "ids", q.IDs, "source", q.Source, "destination", q.Destination, "all", q.All,
		"requeued", ans.Requeued, "skipped", len(ans.Skipped))
	return ans, nil
}

// countRequeueable counts the rows a filter requeue would move (for the confirmation).
func (c *Console) countRequeueable(ctx context.Context, source, destination string) (int64, error) {
	return c.outbox.CountDead(ctx, c.cfg.Outbox.Pool, source, destination)
}

// --- API handlers ---

func (c *Console) apiOutboxRow(w http.ResponseWriter, r *http.Request) {
	o, err := c.getOutboxRow(r.Context(), r.PathValue("id"))
	switch {
	case errors.Is(err, errBadID):
		writeError(w, http.StatusBadRequest, err.Error()+": pass an outbox id as listed by /api/v1/outbox/rows")
	case errors.Is(err, outbox.ErrNotFound):
		writeError(w, http.StatusNotFound, err.Error())
	case err != nil:
		c.serverError(w, r, err)
	default:
		writeJSON(w, http.StatusOK, o)
	}
}

// decodeBody reads a JSON body into v, refusing unknown fields and oversized bodies.
func decodeBody(r *http.Request, v any) (int, string) {
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return http.StatusRequestEntityTooLarge, fmt.Sprintf("request body over %d bytes", MaxRequestBytes)
		}
		return http.StatusBadRequest, "request body is not the expected JSON: " + err.Error()
	}
	if hasNUL(reflect.ValueOf(v)) {
		return http.StatusBadRequest, errNUL
	}
	return 0, ""
}

// errNUL refuses text with a NUL character, which no row, topic or name can hold (PostgreSQL's
// text refuses it).
const errNUL = "a value of the request contains a NUL character (\u0000), which no stored value can hold"

// hasNUL reports whether a string reachable from v (fields, elements, pointers) holds a NUL.
func hasNUL(v reflect.Value) bool {
	switch v.Kind() {
	case reflect.String:
		return strings.ContainsRune(v.String(), 0)
	case reflect.Pointer, reflect.Interface:
		return !v.IsNil() && hasNUL(v.Elem())
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() && hasNUL(v.Field(i)) {
				return true
			}
		}
	case reflect.Slice, reflect.Array:
		for i := range v.Len() {
			if hasNUL(v.Index(i)) {
				return true
			}
		}
	case reflect.Map:
		for _, k := range v.MapKeys() {
			if hasNUL(k) || hasNUL(v.MapIndex(k)) {
				return true
			}
		}
	}
	return false
}

// badText reports why a request's path, query or form cannot be served: a NUL character or
// invalid UTF-8, which no stored value can match; "" when they are fine.
func badText(r *http.Request) string {
	check := func(what, s string) string {
		switch {
		case strings.ContainsRune(s, 0):
			return what + " contains a NUL character, which no stored value can hold"
		case !utf8.ValidString(s):
			return what + " is not valid UTF-8"
		}
		return ""
	}
	if msg := check("the path", r.URL.Path); msg != "" {
		return msg
	}
	for k, vs := range r.URL.Query() {
		for _, v := range vs {
			if msg := check("query parameter "+strconv.Quote(k), v); msg != "" {
				return msg
			}
		}
	}
	for k, vs := range r.PostForm {
		for _, v := range vs {
			if msg := check("form field "+strconv.Quote(k), v); msg != "" {
				return msg
			}
		}
	}
	return ""
}
