package inbox

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/keiro-go/keiro/tracing"
)

// scope is the OpenTelemetry instrumentation scope of every keiro instrument.
const scope = tracing.ScopeName

// instruments are the inbox's metrics (names per tracing.MetricNames) and tracer. Every
// attribute is bounded: consumer name, consumer group, topic, partition, error type.
type instruments struct {
	tracer          trace.Tracer
	processed       metric.Int64Counter
	duplicates      metric.Int64Counter
	failed          metric.Int64Counter
	poisoned        metric.Int64Counter
	deadlettered    metric.Int64Counter
	handlerDuration metric.Float64Histogram
	backlog         metric.Int64Gauge
	// consumed and processDuration are the messaging semantic conventions' consumer metrics.
	consumed        metric.Int64Counter
	processDuration metric.Float64Histogram
	fetchPauses     metric.Int64Counter
	// commitFailures counts the offset commits that failed (each is retried).
	commitFailures metric.Int64Counter
	// dlqOmitted and dlqFailures count dead letters sent without their value and failed
	// dead-letter produces; dlqBlocked, set by a Consumer, is its count of partitions
	// waiting on a failing dead-letter produce (the keiro.inbox.deadletter.blocked gauge).
	dlqOmitted  metric.Int64Counter
	dlqFailures metric.Int64Counter
	dlqBlocked  atomic.Pointer[blockedSource]

	// group is the consumer group, set by the Consumer before it runs ("" for a Store used on
	// its own).
	group string

	// sets caches the attribute sets of the per-message instruments, names the span names per
	// topic: both depend only on bounded values, and building a set sorts and hashes it, once
	// per message otherwise.
	sets  attrSets
	names sync.Map // topic → "process <topic>"

	// lag is observed from the last Kafka measurement, for the partitions owned at collection.
	lagMu    sync.Mutex
	lagGroup string
	lagByTP  map[topicPartition]int64
	lagOwned func(topicPartition) bool
}

func newInstruments(mp metric.MeterProvider, tp trace.TracerProvider) (*instruments, error) {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	m := mp.Meter(scope)
	in := &instruments{tracer: tp.Tracer(scope)}
	var errs [16]error
	in.processed, errs[0] = m.Int64Counter(tracing.MetricInboxProcessed, metric.WithUnit("{message}"),
		metric.WithDescription("Messages whose handler committed."))
	in.duplicates, errs[1] = m.Int64Counter(tracing.MetricInboxDuplicates, metric.WithUnit("{message}"),
		metric.WithDescription("Redelivered messages skipped by the inbox."))
	in.failed, errs[2] = m.Int64Counter(tracing.MetricInboxFailed, metric.WithUnit("{message}"),
		metric.WithDescription("Handler failures and deliveries of previously failed messages."))
	in.poisoned, errs[3] = m.Int64Counter(tracing.MetricInboxPoisoned, metric.WithUnit("{message}"),
		metric.WithDescription("Messages that reached the attempt ceiling or failed permanently."))
	in.deadlettered, errs[4] = m.Int64Counter(tracing.MetricInboxDeadlettered, metric.WithUnit("{message}"),
		metric.WithDescription("Records produced to the dead-letter topic."))
	in.handlerDuration, errs[5] = m.Float64Histogram(tracing.MetricInboxHandlerDuration, metric.WithUnit("s"),
		metric.WithDescription("Time spent in the handler."), metric.WithExplicitBucketBoundaries(tracing.LatencyBuckets...))
	in.backlog, errs[6] = m.Int64Gauge(tracing.MetricInboxBacklog, metric.WithUnit("{message}"),
		metric.WithDescription("Failed inbox rows of this consumer."))
	_, errs[7] = m.Int64ObservableGauge(tracing.MetricConsumerLag, metric.WithUnit("{message}"),
		metric.WithDescription("End offset minus the group's committed offset, measured from Kafka, per partition this member owns."),
		metric.WithInt64Callback(in.observeLag))
	in.consumed, errs[8] = m.Int64Counter(tracing.MetricClientConsumedMessages, metric.WithUnit("{message}"),
		metric.WithDescription("Records polled from Kafka and handed to the inbox, duplicates included."))
	in.processDuration, errs[9] = m.Float64Histogram(tracing.MetricProcessDuration, metric.WithUnit("s"),
		metric.WithDescription("Duration of processing one message: the inbox transaction with its handler."),
		metric.WithExplicitBucketBoundaries(tracing.LatencyBuckets...))
	in.fetchPauses, errs[11] = m.Int64Counter(tracing.MetricConsumerFetchPauses, metric.WithUnit("{pause}"),
		metric.WithDescription("Partition fetches paused because the partition's buffer was full while another partition needed a poll."))
	in.dlqOmitted, errs[12] = m.Int64Counter(tracing.MetricInboxDeadLetterValueOmitted, metric.WithUnit("{message}"),
		metric.WithDescription("Dead letters too large for Kafka, written with their value omitted."))
	in.dlqFailures, errs[13] = m.Int64Counter(tracing.MetricInboxDeadLetterFailures, metric.WithUnit("{produce}"),
		metric.WithDescription("Dead-letter produces that failed and are retried while their partition waits."))
	_, errs[14] = m.Int64ObservableGauge(tracing.MetricInboxDeadLetterBlocked, metric.WithUnit("{partition}"),
		metric.WithDescription("Partitions waiting on a failing dead-letter produce."),
		metric.WithInt64Callback(in.observeBlocked))
	in.commitFailures, errs[15] = m.Int64Counter(tracing.MetricConsumerCommitFailures, metric.WithUnit("{commit}"),
		metric.WithDescription("Offset commits that failed and are retried after the consumer's backoff."))
	if err := errors.Join(errs[:]...); err != nil {
		return nil, fmt.Errorf("create inbox instruments: %w", err)
	}
	return in, nil
}

// consumerAttrs are the attributes of the inbox gauges: the consumer name and the group.
func (in *instruments) consumerAttrs(consumer string) metric.MeasurementOption {
	kvs := []attribute.KeyValue{tracing.ConsumerKey.String(consumer)}
	if in.group != "" {
		kvs = append(kvs, tracing.GroupKey.String(in.group))
	}
	return metric.WithAttributeSet(attribute.NewSet(kvs...))
}

// attrSets is a cache of measurement options by what they are built from.
type attrSets struct {
	mu sync.RWMutex
	m  map[attrSetKey]metric.MeasurementOption
}

// attrSetKey names one attribute set: its kind and the bounded values it is built from.
type attrSetKey struct {
	kind                             attrSetKind
	consumer, group, topic, errorTyp string
}

type attrSetKind uint8

const (
	messageSet  attrSetKind = iota // consumer, topic, group
	consumedSet                    // messaging system, poll, topic, group
	processSet                     // messaging system, process, topic, group, error type
)

// get returns the option of k, building its set on first use.
func (c *attrSets) get(k attrSetKey) metric.MeasurementOption {
	c.mu.RLock()
	o, ok := c.m[k]
	c.mu.RUnlock()
	if ok {
		return o
	}
	o = metric.WithAttributeSet(k.build())
	c.mu.Lock()
	if c.m == nil {
		c.m = map[attrSetKey]metric.MeasurementOption{}
	}
	c.m[k] = o
	c.mu.Unlock()
	return o
}

func (k attrSetKey) build() attribute.Set {
	var kvs []attribute.KeyValue
	switch k.kind {
	case messageSet:
		kvs = append(kvs, tracing.ConsumerKey.String(k.consumer))
	case consumedSet:
		kvs = append(kvs, tracing.MessagingSystemKey.String(tracing.MessagingSystemKafka),
			tracing.MessagingOperationNameKey.String(tracing.OperationPoll))
	case processSet:
		kvs = append(kvs, tracing.MessagingSystemKey.String(tracing.MessagingSystemKafka),
			tracing.MessagingOperationNameKey.String(tracing.OperationProcess))
		if k.errorTyp != "" {
			kvs = append(kvs, tracing.ErrorTypeKey.String(k.errorTyp))
		}
	}
	kvs = append(kvs, tracing.DestinationKey.String(k.topic))
	if k.group != "" {
		kvs = append(kvs, tracing.GroupKey.String(k.group))
	}
	return attribute.NewSet(kvs...)
}

// messageAttrs are the attributes of the per-message counters: consumer name, topic, group.
func (in *instruments) messageAttrs(consumer, topic string) metric.MeasurementOption {
	return in.sets.get(attrSetKey{kind: messageSet, consumer: consumer, group: in.group, topic: topic})
}

// count counts n messages of topic whose result is res.
func (in *instruments) count(ctx context.Context, consumer, topic string, res Result, n int64) {
	attrs := in.messageAttrs(consumer, topic)
	switch res.Outcome {
	case Processed:
		in.processed.Add(ctx, n, attrs)
	case Duplicate:
		in.duplicates.Add(ctx, n, attrs)
	case PreviouslyFailed:
		if res.DeadLettered {
			in.duplicates.Add(ctx, n, attrs) // a redelivered dead letter
		} else {
			in.failed.Add(ctx, n, attrs)
		}
	case HandlerFailed:
		in.failed.Add(ctx, n, attrs)
	case Poisoned:
		in.failed.Add(ctx, n, attrs)
		in.poisoned.Add(ctx, n, attrs)
	}
	in.consumed.Add(ctx, n, in.sets.get(attrSetKey{kind: consumedSet, group: in.group, topic: topic}))
}

// spanName is the process span's name for topic.
func (in *instruments) spanName(topic string) string {
	if n, ok := in.names.Load(topic); ok {
		return n.(string)
	}
	n := "process " + topic
	in.names.Store(topic, n)
	return n
}

// measureLag asks Kafka for the group's lag (end offset minus committed offset per partition)
// and keeps it for the keiro.consumer.lag gauge, which reports the partitions this member owns
// when it is collected. Lag measured this way also shows a partition that stopped moving, which
// a lag sampled at commit time cannot.
func (c *Consumer) measureLag(ctx context.Context) {
	c.mu.Lock()
	cl := c.cl
	c.mu.Unlock()
	if cl == nil {
		return
	}
	lag, err := GroupLag(ctx, cl, c.cfg.Group)
	if err != nil {
		switch {
		case ctx.Err() != nil:
		case errors.Is(err, ErrGroupUnknown):
			// The group has not joined yet (a consumer that just started): nothing to measure.
			c.log.DebugContext(ctx, "measure consumer lag: the group is not known to Kafka yet", "group", c.cfg.Group)
		default:
			c.log.WarnContext(ctx, "measure consumer lag", "group", c.cfg.Group, "error", err)
		}
		return
	}
	byTP := map[topicPartition]int64{}
	for _, ps := range lag.Lag {
		for _, l := range ps {
			if l.Err == nil && l.Lag >= 0 {
				byTP[topicPartition{l.Topic, l.Partition}] = l.Lag
			}
		}
	}
	in := c.in
	in.lagMu.Lock()
	in.lagGroup, in.lagByTP = c.cfg.Group, byTP
	in.lagOwned = func(tp topicPartition) bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		_, ok := c.workers[tp]
		return ok
	}
	in.lagMu.Unlock()
}

// observeLag reports the last measured lag of the partitions owned now: a partition revoked
// since (or every partition, once the consumer stopped) disappears instead of keeping a stale
// value.
func (in *instruments) observeLag(_ context.Context, o metric.Int64Observer) error {
	in.lagMu.Lock()
	defer in.lagMu.Unlock()
	for tp, lag := range in.lagByTP {
		if in.lagOwned == nil || !in.lagOwned(tp) {
			continue
		}
		o.Observe(lag, metric.WithAttributeSet(attribute.NewSet(
			tracing.GroupKey.String(in.lagGroup),
			tracing.DestinationKey.String(tp.topic),
			tracing.PartitionKey.String(strconv.Itoa(int(tp.partition))))))
	}
	return nil
}

// blockedSource is a Consumer's count of partitions blocked on the dead-letter sink.
type blockedSource struct {
	consumer string
	n        *atomic.Int64
}

// observeBlocked reports the partitions blocked on the dead-letter sink (0 when none is), for
// the consumer running with these instruments.
func (in *instruments) observeBlocked(_ context.Context, o metric.Int64Observer) error {
	if src := in.dlqBlocked.Load(); src != nil {
		o.Observe(src.n.Load(), in.consumerAttrs(src.consumer))
	}
	return nil
}

// deadLetterFailed counts a failed dead-letter produce; code is the Kafka error's name ("" for
// another error: error.type _OTHER).
func (in *instruments) deadLetterFailed(ctx context.Context, consumer, code string) {
	if code == "" {
		code = "_OTHER"
	}
	kvs := []attribute.KeyValue{tracing.ConsumerKey.String(consumer), tracing.ErrorTypeKey.String(code)}
	if in.group != "" {
		kvs = append(kvs, tracing.GroupKey.String(in.group))
	}
	in.dlqFailures.Add(ctx, 1, metric.WithAttributeSet(attribute.NewSet(kvs...)))
}

// commitFailed counts a failed offset commit of group's partition of topic; code is the Kafka
// error's name ("" for another error, a timeout among them: error.type _OTHER).
func (in *instruments) commitFailed(ctx context.Context, group, topic string, partition int32, code string) {
	if code == "" {
		code = "_OTHER"
	}
	in.commitFailures.Add(ctx, 1, metric.WithAttributeSet(attribute.NewSet(
		tracing.GroupKey.String(group), tracing.DestinationKey.String(topic),
		tracing.PartitionKey.String(strconv.Itoa(int(partition))), tracing.ErrorTypeKey.String(code))))
}

// processSpan is the process span with what messaging.process.duration needs when it ends.
type processSpan struct {
	trace.Span
	in           *instruments
	start        time.Time
	topic, group string
}

// startProcessSpan starts the `process <topic>` consumer span. Its parent is the record's trace
// context (so one trace runs from the producing transaction to the consumer's effects), and it
// links to that same context (the semantic conventions' creation context).
func (in *instruments) startProcessSpan(ctx context.Context, group string, d *Delivery) (context.Context, trace.Span) {
	topic := d.Event.Destination
	if d.Kafka != nil {
		topic = d.Kafka.Topic
	}
	pctx := tracing.ContextWith(ctx, d.Event.TraceContext)
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer)}
	if sc := trace.SpanContextFromContext(pctx); sc.IsValid() && sc.IsRemote() {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: sc}))
	}
	ctx, inner := in.tracer.Start(pctx, in.spanName(topic), opts...)
	span := &processSpan{Span: inner, in: in, start: time.Now(), topic: topic, group: group}
	if !span.IsRecording() {
		return ctx, span // no SDK or not sampled: skip building the attributes
	}
	attrs := []attribute.KeyValue{
		tracing.MessagingSystemKey.String(tracing.MessagingSystemKafka),
		tracing.MessagingOperationTypeKey.String(tracing.OperationProcess),
		tracing.MessagingOperationNameKey.String(tracing.OperationProcess),
		tracing.MessagingDestinationNameKey.String(topic),
	}
	if d.Kafka != nil {
		attrs = append(attrs,
			tracing.MessagingDestinationPartitionIDKey.String(tracing.PartitionID(d.Kafka.Partition)),
			tracing.MessagingKafkaOffsetKey.Int64(d.Kafka.Offset))
	}
	if d.Event.Key != nil {
		attrs = append(attrs, tracing.MessagingKafkaMessageKeyKey.String(*d.Event.Key))
	}
	if group != "" {
		attrs = append(attrs, tracing.MessagingConsumerGroupNameKey.String(group))
	}
	if d.Event.MessageID != "" {
		attrs = append(attrs, tracing.MessagingMessageIDKey.String(d.Event.MessageID))
	}
	span.SetAttributes(attrs...)
	return ctx, span
}

// endProcessSpan ends the process span and records messaging.process.duration, with
// error.type when the message failed (the handler's error, or the inbox's own).
func endProcessSpan(span trace.Span, res Result, err error) {
	if ps, ok := span.(*processSpan); ok {
		k := attrSetKey{kind: processSet, group: ps.group, topic: ps.topic}
		switch {
		case err != nil:
			k.errorTyp = "inbox_error"
		case res.Outcome == HandlerFailed || res.Outcome == PreviouslyFailed:
			k.errorTyp = "handler_failed"
		case res.Outcome == Poisoned:
			k.errorTyp = "poisoned"
		}
		ps.in.processDuration.Record(context.Background(), time.Since(ps.start).Seconds(), ps.in.sets.get(k))
	}
	if !span.IsRecording() {
		span.End()
		return
	}
	outcome := "failed"
	switch res.Outcome {
	case Processed:
		outcome = "processed"
	case Duplicate:
		outcome = "duplicate"
	case Poisoned:
		outcome = "poisoned"
	case Deferred:
		outcome = "deferred"
	}
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	} else {
		span.SetAttributes(tracing.InboxOutcomeKey.String(outcome))
		if res.Err != nil {
			span.RecordError(res.Err)
			span.SetStatus(codes.Error, res.Err.Error())
		}
	}
	span.End()
}
