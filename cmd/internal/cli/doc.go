// Package cli is the command-line and environment configuration shared by keiro's binaries
// (cmd/relay, cmd/consumer). It is a thin layer over github.com/alecthomas/kong.
//
// Why kong: it is a stable (v1) and maintained library whose grammar is a tagged struct, so
// flags, their environment variables, defaults, help text and subcommands live in one place;
// it prints the environment variable of each flag in --help and supports a default command.
// (peterbourgon/ff/v4 was the other candidate; it is still an alpha release.)
//
// What this package adds on top of kong:
//
//   - every flag reads an environment variable named from App.EnvPrefix and the flag
//     (--batch-size → KEIRO_RELAY_BATCH_SIZE); a flag given on the command line wins over
//     its variable, which wins over the default;
//   - --help lists every flag with its variable and its default, with the defaults of
//     [Secret] and [DSN] flags redacted;
//   - every problem is reported at once: values that do not parse (kong alone stops at the
//     first) and the problems returned by each [FlagValidator] on the selected command path,
//     joined with errors.Join, each naming its flag (see [Problems]);
//   - [Secret] and [DSN] never print their password (String, %v, %#v, slog, JSON);
//   - [App.Run] maps the outcome to an exit code (0, [ExitFailure], [ExitUsage] or an
//     [ExitError]'s code) and binds a context.Context and an [*Env] into each command's Run.
//
// # Using it in a binary
//
// Declare the grammar as a struct. Shared flag groups ([LogFlags], kafkaconfig.Config) are
// embedded with embed:"" tags; each group validates itself through ValidateFlags. Commands are
// fields tagged cmd:""; default:"withargs" makes one the default when no command is typed.
//
//	type grammar struct {
//		cli.LogFlags `embed:""`
//		DatabaseURL  cli.DSN `help:"PostgreSQL connection URL (required)." placeholder:"URL"`
//		Run          runCmd  `cmd:"" default:"withargs" help:"Consume (the default)."`
//		Migrate      migrateCmd `cmd:"" help:"Apply database migrations."`
//	}
//
//	func (g *grammar) ValidateFlags() error {
//		var p cli.Problems
//		if g.DatabaseURL == "" {
//			p.Add("database-url", "is required")
//		}
//		return p.Err()
//	}
//
//	type runCmd struct {
//		BatchSize int `help:"Records per batch." default:"32"`
//	}
//
//	func (c *runCmd) Run(ctx context.Context, env *cli.Env) error { … }
//
//	func main() {
//		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
//		defer stop()
//		app := cli.App{Name: "consumer", EnvPrefix: "KEIRO_CONSUMER", Description: "…"}
//		os.Exit(app.Run(ctx, &grammar{}, os.Args[1:]))
//	}
//
// Do not use kong's required:"" and enum:"" tags: kong reports those one at a time. Check them
// in ValidateFlags instead, and say "(required)" in the help text. See Example for a runnable
// version.
package cli
