package cli_test

import (
	"context"
	"fmt"
	"os"

	"github.com/keiro-go/keiro/cmd/internal/cli"
)

type exampleGrammar struct {
	cli.LogFlags `embed:""`
	DatabaseURL  cli.DSN         `help:"PostgreSQL connection URL (required)." placeholder:"URL"`
	Greet        exampleGreetCmd `cmd:"" default:"withargs" help:"Print a greeting (the default command)."`
}

func (g *exampleGrammar) ValidateFlags() error {
	var p cli.Problems
	if g.DatabaseURL == "" {
		p.Add("database-url", "is required")
	}
	return p.Err()
}

type exampleGreetCmd struct {
	Times int `help:"How many times." default:"1"`
}

func (c *exampleGreetCmd) Run(ctx context.Context, env *cli.Env) error {
	for range c.Times {
		fmt.Fprintln(env.Stdout, "hello")
	}
	return nil
}

func Example() {
	app := cli.App{Name: "demo", EnvPrefix: "KEIRO_DEMO", Stdout: os.Stdout, Stderr: os.Stdout}

	// Every problem at once, each naming its flag (KEIRO_DEMO_TIMES=x would be named too).
	code := app.Run(context.Background(), &exampleGrammar{}, []string{"--times=many", "--log-format=xml"})
	fmt.Println("exit", code)

	code = app.Run(context.Background(), &exampleGrammar{},
		[]string{"--database-url=postgres://app:s3cret@db/app", "greet", "--times=2"})
	fmt.Println("exit", code)

	fmt.Println(cli.DSN("postgres://app:s3cret@db/app"))
	// Output:
	// demo: error: --times: expected a valid 64 bit int but got "many"
	// demo: error: --log-format: unknown format "xml": use text or json
	// demo: error: --database-url: is required
	// exit 2
	// hello
	// hello
	// exit 0
	// postgres://app:******@db/app
}
