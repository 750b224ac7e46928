// Command kafkabroker resolves and runs the Apache Kafka broker of keiro-go's test suite.
//
//	go run ./keirotest/testenv/kafkabroker/cmd/kafkabroker classpath    # resolve the jars (once per machine)
//	go run ./keirotest/testenv/kafkabroker/cmd/kafkabroker run [-brokers 3] [-jvm kafka]
//
// run starts a cluster on loopback, prints KEIRO_TEST_KAFKA_BROKERS=host:port,… for the tests
// to use, and stops it on SIGINT or SIGTERM. -jvm kafka runs the JVMs with Apache Kafka's own
// heap and collector options (kafkabroker.KafkaJVMOptions: G1, 1 GiB) instead of the test
// suite's small serial-collector heap; any other value is a space-separated list of JVM options.
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
		jvm := fs.String("jvm", "", `the JVMs' heap and collector options: "kafka" for Apache Kafka's own (G1, 1 GiB), or a space-separated list; the test suite's small serial-collector heap when empty`)
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		var opts []string
		var heapMB int
		switch *jvm {
		case "":
		case "kafka":
			opts, heapMB = kafkabroker.KafkaJVMOptions, 1024
		default:
			opts = strings.Fields(*jvm)
		}
		c, err := kafkabroker.Start(ctx, kafkabroker.Config{Brokers: *brokers, JVMOptions: opts, HeapMB: heapMB,
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
