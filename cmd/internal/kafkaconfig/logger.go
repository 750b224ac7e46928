package kafkaconfig

import (
	"context"
	"github.com/twmb/franz-go/plugin/kotel"
	"go.opentelemetry.io/otel/metric"
	"log/slog"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Logger returns the option that sends franz-go's own logs (connection failures, metadata
// errors, rebalances) to l, tagged component=kafka. franz-go's info level is chatty, so its
// info messages are logged at debug; its warnings and errors keep their level.
func Logger(l *slog.Logger) kgo.Opt {
	return kgo.WithLogger(&slogLogger{l: l.With("component", "kafka")})
}

type slogLogger struct{ l *slog.Logger }

func slogLevel(lv kgo.LogLevel) slog.Level {
	switch lv {
	case kgo.LogLevelError:
		return slog.LevelError
	case kgo.LogLevelWarn:
		return slog.LevelWarn
	}
	return slog.LevelDebug
}

// Level reports the most verbose kgo level that l would log.
func (s *slogLogger) Level() kgo.LogLevel {
	ctx := context.Background()
	switch {
	case s.l.Enabled(ctx, slog.LevelDebug):
		return kgo.LogLevelDebug
	case s.l.Enabled(ctx, slog.LevelWarn):
		return kgo.LogLevelWarn
	case s.l.Enabled(ctx, slog.LevelError):
		return kgo.LogLevelError
	}
	return kgo.LogLevelNone
}

// Log writes one franz-go message with its key/value pairs.
func (s *slogLogger) Log(lv kgo.LogLevel, msg string, keyvals ...any) {
	s.l.Log(context.Background(), slogLevel(lv), msg, keyvals...)
}

// ClientMetrics reports the Kafka client's own metrics through mp with franz-go's kotel meter:
// connections, connection errors and disconnects per broker, bytes written and read, and
// produced and fetched bytes and records per broker and topic (the messaging.kafka.*
// instruments; in Prometheus messaging_kafka_*). They sit beside keiro's own metrics on
// /metrics, or go to the OTLP collector with them.
func ClientMetrics(mp metric.MeterProvider) kgo.Opt {
	return kgo.WithHooks(kotel.NewMeter(kotel.MeterProvider(mp)))
}
