// Package kafkaconfig turns the Kafka connection settings that keiro's binaries share — seed
// brokers, client id, TLS (server verification, client certificates) and SASL (PLAIN,
// SCRAM-SHA-256, SCRAM-SHA-512) — into franz-go client options.
//
// [Config] is both a library configuration and a kong flag group: embed it in a command with
// `embed:""` and its fields become --brokers, --client-id, --kafka-tls-…, --kafka-sasl-…, each
// with an environment variable (cmd/internal/cli). [Config.ValidateFlags] reports every problem at
// once, each naming its flag; files are read and parsed during validation, so a bad path or a
// certificate without its key is reported before anything connects. The SASL password is a
// cli.Secret and never prints.
//
// Guarantees: [Config.Opts] never returns options that connect in plaintext when TLS is
// enabled, and never sends SASL credentials unless a mechanism is configured. PLAIN sends the
// password in clear: use it only with TLS (validation warns through [Config.Warnings]).
//
// [Logger] routes franz-go's own logs (connection and metadata failures) to a slog.Logger.
package kafkaconfig
