package console

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/keiro-go/keiro/failure"
	"github.com/keiro-go/keiro/inbox"
)

// InboxSummary answers GET /api/v1/inbox/summary.
type InboxSummary struct {
	// Consumer is the inbox consumer this server runs (its failures are listed and retried).
	Consumer string `json:"consumer"`
	// Consumers has one entry per inbox consumer name in the table, sorted.
	Consumers []ConsumerCounts `json:"consumers"`
	// LastHour has one bucket per minute of the last hour for Consumer, oldest first: rows
	// completed and rows whose last attempt failed in the minute.
	LastHour []RateBucket `json:"last_hour"`
	// ReadAt is the database's clock when the summary was read.
	ReadAt time.Time `json:"read_at"`
}

// ConsumerCounts is one inbox consumer's rows.
type ConsumerCounts struct {
	// Consumer is the inbox consumer name.
	Consumer string `json:"consumer"`
	// Completed counts processed rows still retained (the dedupe window).
	Completed int64 `json:"completed"`
	// Retrying counts failed rows that a redelivery runs again.
	Retrying int64 `json:"retrying"`
	// Poisoned counts failed rows past their attempt ceiling or failed permanently: dead-lettered,
	// waiting for an operator's retry.
	Poisoned int64 `json:"poisoned"`
	// Archived counts failed rows an operator set aside: in neither Retrying nor Poisoned.
	Archived int64 `json:"archived"`
	// OldestFailureAgeSeconds is the age of the oldest failure not archived; null when none.
	OldestFailureAgeSeconds *float64 `json:"oldest_failure_age_seconds"`
}

func (c *Console) readInboxSummary(ctx context.Context) (InboxSummary, error) {
	ic := c.cfg.Inbox
	s := InboxSummary{Consumer: ic.Consumer, Consumers: []ConsumerCounts{}}
	var origin time.Time
	if err := ic.Pool.QueryRow(ctx, sqlInboxRecent).Scan(&s.ReadAt, &origin); err != nil {
		return s, fmt.Errorf("read inbox summary: %w", err)
	}
	counts, err := c.inbox.CountByConsumer(ctx, ic.Pool)
	if err != nil {
		return s, fmt.Errorf("read inbox summary: %w", err)
	}
	for _, n := range counts {
		cc := ConsumerCounts{Consumer: n.Consumer, Completed: n.Completed, Retrying: n.Retrying, Poisoned: n.Poisoned, Archived: n.Archived}
		if n.OldestFailure != nil {
			cc.OldestFailureAgeSeconds = ageSeconds(s.ReadAt, *n.OldestFailure)
		}
		s.Consumers = append(s.Consumers, cc)
	}
	if !slices.ContainsFunc(s.Consumers, func(cc ConsumerCounts) bool { return cc.Consumer == ic.Consumer }) {
		s.Consumers = append(s.Consumers, ConsumerCounts{Consumer: ic.Consumer})
		sort.Slice(s.Consumers, func(i, j int) bool { return s.Consumers[i].Consumer < s.Consumers[j].Consumer })
	}
	minutes, err := c.inbox.Activity(ctx, ic.Pool, origin, 60)
	if err != nil {
		return s, fmt.Errorf("read inbox rates: %w", err)
	}
	s.LastHour = make([]RateBucket, len(minutes))
	for i, m := range minutes {
		s.LastHour[i] = RateBucket{Minute: m.Start, Sent: m.Completed, Failed: m.Failed}
	}
	return s, nil
}

// InboxEntry is one inbox row in the API's lists and detail.
type InboxEntry struct {
	// Consumer is the inbox consumer name.
	Consumer string `json:"consumer"`
	// Source and DedupeKey identify the row (retry takes them).
	Source    string `json:"source"`
	DedupeKey string `json:"dedupe_key"`
	// Status is "failed" or "completed".
	Status string `json:"status"`
	// Attempts is the number of failed attempts.
	Attempts int `json:"attempts"`
	// Poisoned reports a row that redeliveries no longer run (it was dead-lettered).
	Poisoned bool `json:"poisoned"`
	// LastError is the last handler error.
	LastError string `json:"last_error,omitempty"`
	// MessageID, EventType and Destination describe the event.
	MessageID   string `json:"message_id"`
	EventType   string `json:"event_type"`
	Destination string `json:"destination"`
	// Kafka is where the record was read, if it came from Kafka.
	Kafka *KafkaPosition `json:"kafka,omitempty"`
	// ReceivedAt, FailedAt and CompletedAt are the row's timestamps.
	ReceivedAt  time.Time  `json:"received_at"`
	FailedAt    *time.Time `json:"failed_at,omitempty"`
	CompletedAt *time.Time `json:"completed_at,omitempty"`
	// Headers are the keiro headers of the stored envelope, in order.
	Headers []Header `json:"headers"`
	// Payload is the stored payload (a preview in lists).
	Payload Payload `json:"payload"`
	// AttemptHistory is the row's failed attempts, oldest first (the last 20); only in the
	// answer for one row.
	AttemptHistory []failure.Attempt `json:"attempt_history,omitempty"`
}

// KafkaPosition is a record's topic, partition and offset.
type KafkaPosition struct {
	// Topic is the topic the record was read from.
	Topic string `json:"topic"`
	// Partition is the record's partition.
	Partition int32 `json:"partition"`
	// Offset is the record's offset.
	Offset int64 `json:"offset"`
}

// Path is the entry's console path segment: source/dedupe-key, escaped.
func (e InboxEntry) Path() string { return pathEscape(e.Source) + "/" + pathEscape(e.DedupeKey) }

func (c *Console) inboxEntry(e inbox.Entry, previewBytes int) InboxEntry {
	ev := e.Delivery.Event
	ev.Source = e.Source
	out := InboxEntry{
		Consumer: c.cfg.Inbox.Consumer, Source: e.Source, DedupeKey: e.DedupeKey, Status: string(e.Status),
		Attempts: e.Attempts, Poisoned: e.Poisoned, LastError: e.LastError, MessageID: ev.MessageID,
		EventType: ev.EventType, Destination: ev.Destination, ReceivedAt: e.ReceivedAt, FailedAt: e.FailedAt,
		CompletedAt: e.CompletedAt, Headers: headersOf(&ev),
	}
	if k := e.Delivery.Kafka; k != nil {
		out.Kafka = &KafkaPosition{Topic: k.Topic, Partition: k.Partition, Offset: k.Offset}
	}
	p := ev.Payload
	out.Payload = newPayload(p[:min(len(p), previewBytes)], e.PayloadSize, ev.ContentType)
	return out
}

// InboxPage answers GET /api/v1/inbox/failed.
type InboxPage struct {
	// Rows are the failed rows of the page, oldest failure first.
	Rows []InboxEntry `json:"rows"`
	// NextCursor continues the listing (?cursor=); empty on the last page.
	NextCursor string `json:"next_cursor,omitempty"`
}

// inboxCursor is the position after which a failed-row listing continues.
type inboxCursor struct {
	FailedAt  time.Time `json:"t"`
	Source    string    `json:"s"`
	DedupeKey string    `json:"k"`
}

func encodeInboxCursor(e inbox.Entry) string {
	cur := inboxCursor{Source: e.Source, DedupeKey: e.DedupeKey}
	if e.FailedAt != nil {
		cur.FailedAt = *e.FailedAt
	}
	b, _ := json.Marshal(cur)
	return base64.RawURLEncoding.EncodeToString(b)
}

func decodeInboxCursor(s string) (*inbox.Entry, error) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	var cur inboxCursor
	if err == nil {
		err = json.Unmarshal(b, &cur)
	}
	if err != nil || cur.FailedAt.IsZero() {
		return nil, fmt.Errorf("cursor %q is not one this API returned: start again without it", s)
	}
	return &inbox.Entry{Source: cur.Source, DedupeKey: cur.DedupeKey, FailedAt: &cur.FailedAt}, nil
}

// badRequest marks an error of the request's parameters (answered 400).
type badRequest struct{ error }

func (c *Console) listInboxFailed(ctx context.Context, r *http.Request) (InboxPage, error) {
	q := r.URL.Query()
	limit, err := pageSize(r)
	if err != nil {
		return InboxPage{}, badRequest{err}
	}
	archived, err := parseArchived(r)
	if err != nil {
		return InboxPage{}, badRequest{err}
	}
	opts := inbox.ListOptions{Source: strings.TrimSpace(q.Get("source")), Limit: limit + 1, Archived: archived,
		PayloadBytes: DefaultPreviewBytes}
	if cur := q.Get("cursor"); cur != "" {
		if opts.After, err = decodeInboxCursor(cur); err != nil {
			return InboxPage{}, badRequest{err}
		}
	}
	entries, err := c.inbox.ListFailed(ctx, c.cfg.Inbox.Pool, opts)
	if err != nil {
		return InboxPage{}, err
	}
	page := InboxPage{Rows: []InboxEntry{}}
	if len(entries) > limit {
		entries = entries[:limit]
		page.NextCursor = encodeInboxCursor(entries[limit-1])
	}
	for _, e := range entries {
		page.Rows = append(page.Rows, c.inboxEntry(e, DefaultPreviewBytes))
	}
	return page, nil
}

// inboxKey reads and checks the {source}/{key...} of a path.
func inboxKey(r *http.Request) (inbox.Key, error) {
	k := inbox.Key{Source: r.PathValue("source"), DedupeKey: r.PathValue("key")}
	if k.Source == "" || k.DedupeKey == "" {
		return k, errors.New("name the row as /SOURCE/DEDUPE-KEY (both non-empty)")
	}
	return k, nil
}

// RetryRequest is the body of POST /api/v1/inbox/retry: keys, or all.
type RetryRequest struct {
	// Keys are the rows to re-run; at most MaxSelection.
	Keys []RetryKey `json:"keys,omitempty"`
	// All re-runs every failed row of the consumer, oldest failure first, up to MaxSelection
	// per request (Remaining says whether to call again).
	All bool `json:"all,omitempty"`
}

// RetryKey names one inbox row.
type RetryKey struct {
	// Source is the event's source.
	Source string `json:"source"`
	// DedupeKey is the row's dedupe key.
	DedupeKey string `json:"dedupe_key"`
}

// RetryAnswer answers a retry.
type RetryAnswer struct {
	// Results has one entry per row, in request order.
	Results []RetryResult `json:"results"`
	// Succeeded counts rows now completed (processed now, or already completed).
	Succeeded int `json:"succeeded"`
	// Failed counts rows that failed again or could not be re-run.
	Failed int `json:"failed"`
	// Remaining reports, for All, that more failed rows were left for another request.
	Remaining bool `json:"remaining,omitempty"`
}

// RetryResult is one row's re-run.
type RetryResult struct {
	// Source and DedupeKey name the row.
	Source    string `json:"source"`
	DedupeKey string `json:"dedupe_key"`
	// Outcome is processed, duplicate (already completed), handler_failed, poisoned, or error
	// (the row is missing or the database failed).
	Outcome string `json:"outcome"`
	// Attempts is the row's failed-attempt count after the re-run.
	Attempts int `json:"attempts"`
	// Error is the handler's or the lookup's error.
	Error string `json:"error,omitempty"`
}

func (q RetryRequest) validate() error {
	var errs []error
	if q.All == (len(q.Keys) > 0) {
		errs = append(errs, errors.New("give either keys (source and dedupe_key) or all"))
	}
	if len(q.Keys) > MaxSelection {
		errs = append(errs, fmt.Errorf("at most %d keys per request, got %d", MaxSelection, len(q.Keys)))
	}
	for i, k := range q.Keys {
		if k.Source == "" || k.DedupeKey == "" {
			errs = append(errs, fmt.Errorf("keys[%d]: source and dedupe_key are both required", i))
		}
	}
	return errors.Join(errs...)
}

// retry re-runs each row through the consumer's handler (inbox.Admin.Reprocess, as
// `consumer inbox failed retry`), and logs who retried what.
func (c *Console) retry(r *http.Request, q RetryRequest) (RetryAnswer, error) {
	ctx := r.Context()
	ans := RetryAnswer{Results: []RetryResult{}}
	keys := make([]inbox.Key, 0, len(q.Keys))
	for _, k := range q.Keys {
		keys = append(keys, inbox.Key{Source: k.Source, DedupeKey: k.DedupeKey})
	}
	if q.All {
		page, err := c.inbox.ListFailed(ctx, c.cfg.Inbox.Pool, inbox.ListOptions{Limit: MaxSelection + 1,
			PayloadBytes: inbox.NoPayload})
		if err != nil {
			return ans, err
		}
		if len(page) > MaxSelection {
			page, ans.Remaining = page[:MaxSelection], true
		}
		for _, e := range page {
			keys = append(keys, inbox.Key{Source: e.Source, DedupeKey: e.DedupeKey})
		}
	}
	for _, k := range keys {
		res, err := c.inbox.Reprocess(ctx, c.cfg.Inbox.Pool, k, c.cfg.Inbox.Handler)
		rr := RetryResult{Source: k.Source, DedupeKey: k.DedupeKey, Attempts: res.Attempts}
		switch {
		case err != nil:
			rr.Outcome, rr.Error = "error", err.Error()
			ans.Failed++
		case res.Outcome == inbox.Processed || res.Outcome == inbox.Duplicate:
			rr.Outcome = outcomeName(res.Outcome)
			ans.Succeeded++
		default:
			rr.Outcome = outcomeName(res.Outcome)
			if res.Err != nil {
				rr.Error = res.Err.Error()
			}
			ans.Failed++
		}
		ans.Results = append(ans.Results, rr)
	}
	c.action(r, "inbox retry", "consumer", c.cfg.Inbox.Consumer, "keys", len(keys), "all", q.All,
		"succeeded", ans.Succeeded, "failed", ans.Failed)
	return ans, nil
}

// outcomeName is an outcome as the API spells it (snake case).
func outcomeName(o inbox.Outcome) string {
	switch o {
	case inbox.Processed:
		return "processed"
	case inbox.Duplicate:
		return "duplicate"
	case inbox.HandlerFailed:
		return "handler_failed"
	case inbox.Poisoned:
		return "poisoned"
	}
	return strings.ToLower(o.String())
}

// ConsumerLag answers GET /api/v1/consumer/lag.
type ConsumerLag struct {
	// Group is the consumer group.
	Group string `json:"group"`
	// State is the group's state as Kafka reports it (Stable, Empty, PreparingRebalance…).
	State string `json:"state"`
	// Members counts the group's members.
	Members int `json:"members"`
	// Partitions has one entry per partition the group consumes or committed, by topic and
	// partition.
	Partitions []PartitionLag `json:"partitions"`
	// TotalLag sums the partitions' lag.
	TotalLag int64 `json:"total_lag"`
	// Stuck counts the partitions shown stuck (see PartitionLag.StuckSince).
	Stuck int `json:"stuck"`
	// StuckAfterSeconds is how long a partition with records waiting may go without moving
	// before it is shown stuck (InboxConfig.StuckAfter).
	StuckAfterSeconds float64 `json:"stuck_after_seconds"`
	// ReadAt is when the offsets were read from Kafka.
	ReadAt time.Time `json:"read_at"`
}

// PartitionLag is one partition's position.
type PartitionLag struct {
	// Topic is the partition's topic.
	Topic string `json:"topic"`
	// Partition is the partition's number.
	Partition int32 `json:"partition"`
	// Committed is the group's committed offset (the next record it will read); -1 when the
	// group has not committed on this partition.
	Committed int64 `json:"committed"`
	// End is the partition's log end offset.
	End int64 `json:"end"`
	// Lag is End minus Committed (from the log start when nothing is committed); -1 if unknown.
	Lag int64 `json:"lag"`
	// Member is the client id and host of the member assigned the partition; empty when none.
	Member string `json:"member,omitempty"`
	// Error is the commit or end-offset error, if any.
	Error string `json:"error,omitempty"`
	// Progress is the running consumer's own view of the partition, when this server runs
	// the member that owns it (InboxConfig.Progress); absent otherwise.
	Progress *PartitionProgress `json:"progress,omitempty"`
}

// PartitionProgress is what the running consumer knows of a partition it owns, read from its
// memory (inbox.Consumer.Progress): the age of the oldest unconsumed record is that of the
// oldest record it fetched and has not finished, which costs no request to Kafka.
type PartitionProgress struct {
	// Waiting counts the records fetched and not yet done, the one in flight included.
	Waiting int `json:"waiting"`
	// InFlight is the offset of the record being processed; null between records.
	InFlight *int64 `json:"in_flight"`
	// InFlightSeconds is how long the record in flight has been processed; null when none.
	InFlightSeconds *float64 `json:"in_flight_seconds"`
	// OldestWaitingAgeSeconds is the age of the oldest waiting record (from its Kafka
	// timestamp); null when nothing waits.
	OldestWaitingAgeSeconds *float64 `json:"oldest_waiting_age_seconds"`
	// LastCommitAgeSeconds is the time since this member last committed the partition's
	// offset; null when it has committed none since it was assigned the partition.
	LastCommitAgeSeconds *float64 `json:"last_commit_age_seconds"`
	// MovedAt is when the partition last moved (a record started or finished, or the
	// partition was assigned).
	MovedAt time.Time `json:"moved_at"`
	// StuckSince is set when records wait and nothing moved for StuckAfterSeconds: the time
	// the partition last moved. Null when it is not stuck.
	StuckSince *time.Time `json:"stuck_since"`
	// DeadLetterBlockedSince is set when the partition waits on a failing dead-letter produce
	// (the dead-letter topic missing, not writable, or Kafka down): when it began waiting.
	// DeadLetterError is the last failure. Absent when it does not wait on one.
	DeadLetterBlockedSince *time.Time `json:"dead_letter_blocked_since,omitempty"`
	DeadLetterError        string     `json:"dead_letter_error,omitempty"`
}

// Stuck reports a stuck partition.
func (p PartitionLag) Stuck() bool { return p.Progress != nil && p.Progress.StuckSince != nil }

// progressOf is the API's form of a consumer's partition progress at now.
func progressOf(p inbox.PartitionProgress, now time.Time, stuckAfter time.Duration) *PartitionProgress {
	out := &PartitionProgress{Waiting: p.Waiting, MovedAt: p.MovedAt.UTC(),
		OldestWaitingAgeSeconds: ageSeconds(now, p.OldestWaiting), LastCommitAgeSeconds: ageSeconds(now, p.CommittedAt)}
	if p.InFlight >= 0 {
		off := p.InFlight
		out.InFlight, out.InFlightSeconds = &off, ageSeconds(now, p.InFlightSince)
	}
	if since, stuck := p.StuckSince(now, stuckAfter); stuck {
		since = since.UTC()
		out.StuckSince = &since
	}
	if !p.DeadLetterBlockedSince.IsZero() {
		since := p.DeadLetterBlockedSince.UTC()
		out.DeadLetterBlockedSince, out.DeadLetterError = &since, p.DeadLetterError
	}
	return out
}

// errNoKafka reports a lag request on a console without a Kafka client.
var errNoKafka = errors.New("consumer lag is not available: the console has no Kafka client (InboxConfig.Kafka)")

func (c *Console) readLag(ctx context.Context) (ConsumerLag, error) {
	ic := c.cfg.Inbox
	out := ConsumerLag{Group: ic.Group, Partitions: []PartitionLag{}, StuckAfterSeconds: ic.StuckAfter.Seconds()}
	if ic.Kafka == nil && ic.Progress == nil {
		return out, errNoKafka
	}
	if ic.Kafka != nil {
		g, err := inbox.GroupLag(ctx, ic.Kafka, ic.Group)
		switch {
		case errors.Is(err, inbox.ErrGroupUnknown):
			out.State = "Unknown" // the group never joined nor committed
		case err != nil:
			return out, err
		default:
			out.State, out.Members = g.State, len(g.Members)
			for _, l := range g.Lag.Sorted() {
				pl := PartitionLag{Topic: l.Topic, Partition: l.Partition, Committed: l.Commit.At, End: l.End.Offset, Lag: l.Lag}
				if l.Member != nil {
					pl.Member = strings.TrimSpace(l.Member.ClientID + " " + l.Member.ClientHost)
				}
				if l.Err != nil {
					pl.Error = l.Err.Error()
				}
				if pl.Lag > 0 {
					out.TotalLag += pl.Lag
				}
				out.Partitions = append(out.Partitions, pl)
			}
		}
	} else {
		out.State = "Unknown" // no Kafka client: the running member's view alone
	}
	out.ReadAt = time.Now().UTC()
	if ic.Progress != nil {
		c.mergeProgress(&out, ic.Progress.Progress())
	}
	return out, nil
}

// mergeProgress adds the running consumer's view to the partitions it owns (adding those Kafka
// did not list, with unknown offsets) and counts the stuck ones.
func (c *Console) mergeProgress(out *ConsumerLag, ps []inbox.PartitionProgress) {
	idx := make(map[topicPartition]int, len(out.Partitions))
	for i, p := range out.Partitions {
		idx[topicPartition{p.Topic, p.Partition}] = i
	}
	for _, p := range ps {
		i, ok := idx[topicPartition{p.Topic, p.Partition}]
		if !ok {
			out.Partitions = append(out.Partitions, PartitionLag{Topic: p.Topic, Partition: p.Partition, Committed: p.Committed, End: -1, Lag: -1})
			i = len(out.Partitions) - 1
		}
		out.Partitions[i].Progress = progressOf(p, out.ReadAt, c.cfg.Inbox.StuckAfter)
	}
	sort.SliceStable(out.Partitions, func(i, j int) bool {
		a, b := out.Partitions[i], out.Partitions[j]
		if a.Topic != b.Topic {
			return a.Topic < b.Topic
		}
		return a.Partition < b.Partition
	})
	for _, p := range out.Partitions {
		if p.Stuck() {
			out.Stuck++
		}
	}
}

// topicPartition names a partition.
type topicPartition struct {
	topic     string
	partition int32
}

// --- API handlers ---

func (c *Console) apiInboxFailed(w http.ResponseWriter, r *http.Request) {
	page, err := c.listInboxFailed(r.Context(), r)
	var bad badRequest
	switch {
	case errors.As(err, &bad):
		writeError(w, http.StatusBadRequest, bad.Error())
	case err != nil:
		c.serverError(w, r, err)
	default:
		writeJSON(w, http.StatusOK, page)
	}
}

func (c *Console) apiInboxEntry(w http.ResponseWriter, r *http.Request) {
	k, err := inboxKey(r)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	e, err := c.inboxDetail(r.Context(), k)
	switch {
	case errors.Is(err, inbox.ErrNotFound):
		writeError(w, http.StatusNotFound, err.Error())
	case err != nil:
		c.serverError(w, r, err)
	default:
		writeJSON(w, http.StatusOK, e)
	}
}

// inboxDetail is one row with its payload and attempt history, for its page and its answer.
func (c *Console) inboxDetail(ctx context.Context, k inbox.Key) (InboxEntry, error) {
	e, err := c.inbox.Lookup(ctx, c.cfg.Inbox.Pool, k)
	if err != nil {
		return InboxEntry{}, err
	}
	out := c.inboxEntry(e, DefaultDetailPayloadBytes)
	if out.AttemptHistory, err = c.inbox.AttemptHistory(ctx, c.cfg.Inbox.Pool, k); err != nil {
		return InboxEntry{}, err
	}
	return out, nil
}

func (c *Console) apiInboxRetry(w http.ResponseWriter, r *http.Request) {
	if c.cfg.Inbox.Handler == nil {
		writeError(w, http.StatusNotImplemented, "retry is not available: the console has no handler (InboxConfig.Handler)")
		return
	}
	apiAction(c, "retry", RetryRequest.validate, c.retry)(w, r)
}

func (c *Console) apiLag(w http.ResponseWriter, r *http.Request) {
	l, err := c.readLag(r.Context())
	switch {
	case errors.Is(err, errNoKafka):
		writeError(w, http.StatusNotImplemented, err.Error())
	case err != nil:
		c.log.Error("console: read lag", "err", err)
		writeError(w, http.StatusBadGateway, err.Error())
	default:
		writeJSON(w, http.StatusOK, l)
	}
}
