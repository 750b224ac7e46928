package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/outbox"
)

// TestTraceInJaeger follows events from the business transaction to the consumer's effects
// through a real trace backend, as an operator would read them: the service's request span
// (exported by the test's own SDK over OTLP/HTTP), the relay binary's send spans (OTLP/HTTP)
// and the consumer binary's process spans (OTLP/gRPC), on the real broker, read back from
// Jaeger's query API — one trace per request, the parents and links of the context each hop
// carries in the record's headers, the span kinds, and the messaging semantic conventions'
// attributes with their types. In both relay modes.
func TestTraceInJaeger(t *testing.T) {
	t.Parallel()
	tb := testenv.NewTraceBackend(t)
	for _, mode := range []string{"claim", "log"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			traceThroughBackend(t, tb, mode)
		})
	}
}

func traceThroughBackend(t *testing.T, tb *testenv.TraceBackend, mode string) {
	ctx := context.Background()
	db := testenv.NewDB(t)
	effectsFixture(t, db)
	kc := testenv.NewRealKafka(t)
	topic := kc.Topic("e2e.traced.v1")
	kc.CreateTopic(t, topic, 2)
	group := kc.Group("traced")
	service := "orders-" + mode

	// The business service: its own SDK, exporting to the backend as a user's service would.
	exp, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(tb.OTLPEndpoint+"/v1/traces"))
	require.NoError(t, err)
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp, sdktrace.WithBatchTimeout(50*time.Millisecond)),
		sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.name", service))))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })

	telemetry := func(name, protocol, endpoint string) []string {
		return []string{
			"OTEL_SERVICE_NAME=" + name,
			"OTEL_TRACES_EXPORTER=otlp",
			"OTEL_EXPORTER_OTLP_PROTOCOL=" + protocol,
			"OTEL_EXPORTER_OTLP_ENDPOINT=" + endpoint,
			"OTEL_BSP_SCHEDULE_DELAY=100",
		}
	}
	relayExtra := telemetry("keiro-relay-"+mode, "http/protobuf", tb.OTLPEndpoint)
	if mode == "log" {
		slot := outbox.DefaultLogSlot(db.Schema)
		relayExtra = append(relayExtra, "KEIRO_RELAY_MODE=log", "KEIRO_RELAY_LOG_SLOT="+slot)
		t.Cleanup(func() { dropSlot(t, db, slot) }) // after the relay's kill (cleanups run last first)
	}
	relay := startProc(t, "relay", relayBin, relayAddrRe, relayEnv(db, kc, relayExtra...))
	if mode == "log" {
		// Every event is enqueued once the schema is in log mode.
		testenv.WaitFor(t, time.Minute, "the log-mode relay streaming its slot", func() bool {
			return replicatingRe.MatchString(relay.log())
		})
	}
	relay.waitAddr(t, time.Minute)
	consumerProtocol, consumerEndpoint := "grpc", tb.OTLPGRPCEndpoint
	if consumerEndpoint == "" { // a backend named by the environment: its OTLP/HTTP receiver
		consumerProtocol, consumerEndpoint = "http/protobuf", tb.OTLPEndpoint
	}
	consumer := startProc(t, "consumer", consumerBin, consumerAddrRe,
		consumerEnv(db, kc, group, topic, telemetry("keiro-consumer-"+mode, consumerProtocol, consumerEndpoint)...))
	consumer.waitAddr(t, time.Minute)

	// Three requests, each a server span whose transaction enqueues two events of one key.
	ob, err := outbox.NewStore(db.Schema)
	require.NoError(t, err)
	type request struct {
		traceID, spanID string
		events          []envelope.Event
	}
	var requests []request
	for i := range 3 {
		key := fmt.Sprintf("customer-%d", i)
		rctx, span := tp.Tracer("orders").Start(ctx, "POST /orders", trace.WithSpanKind(trace.SpanKindServer))
		evs := []envelope.Event{keyedEvent(topic, key, 1), keyedEvent(topic, key, 2)}
		require.NoError(t, enqueue(rctx, db.Pool, ob, evs...))
		span.End()
		sc := span.SpanContext()
		requests = append(requests, request{traceID: sc.TraceID().String(), spanID: sc.SpanID().String(), events: evs})
	}
	require.NoError(t, tp.ForceFlush(ctx))

	testenv.WaitFor(t, 2*time.Minute, "every event's effect applied", func() bool {
		var n int
		err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+db.Schema+`.effects`).Scan(&n)
		return err == nil && n == 6
	})

	for _, r := range requests {
		spans := tb.WaitTrace(t, r.traceID, 2*time.Minute, func(spans []testenv.Span) bool {
			return countSpans(spans, "send "+topic) == len(r.events) && countSpans(spans, "process "+topic) == len(r.events)
		})
		byID := map[string]testenv.Span{}
		for _, s := range spans {
			require.Equal(t, r.traceID, s.TraceID)
			byID[s.SpanID] = s
		}
		root, ok := byID[r.spanID]
		require.True(t, ok, "the service's request span is in the trace")
		require.Equal(t, service, root.Service)
		require.Equal(t, "server", root.Kind)

		for _, ev := range r.events {
			send := onlySpan(t, spans, "send "+topic, ev.MessageID)
			// send <topic>: the relay's producer span, a child of the business span that enqueued.
			require.Equal(t, "keiro-relay-"+mode, send.Service)
			require.Equal(t, "producer", send.Kind)
			require.Equal(t, r.spanID, send.ParentSpanID, "%s: send's parent is the request span", ev.MessageID)
			require.Equal(t, "unset", send.Status)
			sa := send.Attributes
			require.Equal(t, "kafka", sa["messaging.system"])
			require.Equal(t, "send", sa["messaging.operation.type"])
			require.Equal(t, "send", sa["messaging.operation.name"])
			require.Equal(t, topic, sa["messaging.destination.name"])
			require.Equal(t, *ev.Key, sa["messaging.kafka.message.key"])
			require.IsType(t, "", sa["messaging.destination.partition.id"], "partition id is a string attribute")
			require.Contains(t, []any{"0", "1"}, sa["messaging.destination.partition.id"])
			require.IsType(t, int64(0), sa["messaging.kafka.offset"], "offset is an int attribute")

			// process <topic>: the consumer's span, parent and link = the send span (the
			// traceparent the record carried), on the same partition and offset.
			process := onlySpan(t, spans, "process "+topic, ev.MessageID)
			require.Equal(t, "keiro-consumer-"+mode, process.Service)
			require.Equal(t, "consumer", process.Kind)
			require.Equal(t, send.SpanID, process.ParentSpanID, "%s: process's parent is the send span", ev.MessageID)
			require.Equal(t, []testenv.SpanLink{{TraceID: r.traceID, SpanID: send.SpanID}}, process.Links,
				"%s: the process span links the creation context", ev.MessageID)
			pa := process.Attributes
			require.Equal(t, "kafka", pa["messaging.system"])
			require.Equal(t, "process", pa["messaging.operation.type"])
			require.Equal(t, "process", pa["messaging.operation.name"])
			require.Equal(t, topic, pa["messaging.destination.name"])
			require.Equal(t, group, pa["messaging.consumer.group.name"])
			require.Equal(t, sa["messaging.destination.partition.id"], pa["messaging.destination.partition.id"])
			require.Equal(t, sa["messaging.kafka.offset"], pa["messaging.kafka.offset"])
			require.Equal(t, *ev.Key, pa["messaging.kafka.message.key"])
			require.Equal(t, "processed", pa["keiro.inbox.outcome"])
		}
	}
}

func countSpans(spans []testenv.Span, name string) int {
	n := 0
	for _, s := range spans {
		if s.Name == name {
			n++
		}
	}
	return n
}

// onlySpan returns the one span called name for message id, failing the test unless there is
// exactly one.
func onlySpan(t *testing.T, spans []testenv.Span, name, messageID string) testenv.Span {
	t.Helper()
	var found []testenv.Span
	for _, s := range spans {
		if s.Name == name && s.Attributes["messaging.message.id"] == messageID {
			found = append(found, s)
		}
	}
	require.Len(t, found, 1, "%s spans for %s", name, messageID)
	return found[0]
}
