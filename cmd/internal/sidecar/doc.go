// Package sidecar is what keiro's two binaries, cmd/relay and cmd/consumer, share around their
// own commands: the process's start and exit ([Main]), the command line's frame ([Sidecar]: the
// binary's name, its environment prefix and the healthcheck dispatched before any flag is
// parsed), the database flags ([DB]) and the migrate step ([DB.Migrate]).
//
// A binary describes itself once:
//
//	var consumerSidecar = &sidecar.Sidecar{Name: "consumer", EnvPrefix: "KEIRO_CONSUMER", …}
//
//	func main() { sidecar.Main(run) }
//
//	func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
//		return consumerSidecar.Run(ctx, &grammar{}, args, stdout, stderr)
//	}
//
// and embeds [DB] (in a flag group of its own, whose ValidateFlags calls [DB.Validate] with the
// binary's prefix) and [HealthcheckCmd] in its grammar. What differs between the binaries (the
// help of --database-url and --pgbouncer, the healthcheck's address) is a field of [Sidecar],
// so that their flags, environment variables, help and exit codes stay what they were.
package sidecar
