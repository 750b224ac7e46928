// Command kafkabroker resolves and runs the Apache Kafka broker of keiro-go's test suite.
//
//	go run ./keirotest/testenv/kafkabroker/cmd/kafkabroker classpath    # resolve the jars (once per machine)
//	go run ./keirotest/testenv/kafkabroker/cmd/kafkabroker run [-brokers 3]
//
// run starts a cluster on loopback, prints KEIRO_TEST_KAFKA_BROKERS=host:port,… for the tests
// to use, and stops it on SIGINT or SIGTERM.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/keiro-go/keiro/keirotest/testenv/kafkabroker"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "kafkabroker:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("usage: kafkabroker classpath | run [-brokers N]")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	switch args[0] {
	case "classpath":
		cp, err := kafkabroker.Classpath(ctx)
		if err != nil {
			return err
		}
		fmt.Printf("Apache Kafka %s: %d jars\n", kafkabroker.Version, len(strings.Split(cp, ":")))
		return nil
	case "run":
		fs := flag.NewFlagSet("run", flag.ContinueOnError)
		brokers := fs.Int("brokers", 1, "number of brokers (more than 1 adds a controller of their own)")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		c, err := kafkabroker.Start(ctx, kafkabroker.Config{Brokers: *brokers,
			Props: map[string]string{"auto.create.topics.enable": "false"}})
		if err != nil {
			return err
		}
		defer c.Close()
		fmt.Printf("KEIRO_TEST_KAFKA_BROKERS=%s\n", strings.Join(c.Seeds(), ","))
		<-ctx.Done()
		return nil
	}
	return fmt.Errorf("unknown command %q: classpath or run", args[0])
}
