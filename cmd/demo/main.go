package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

func main() {
	os.Exit(realMain(os.Args[1:], os.Stdout, os.Stderr))
}

// realMain parses args, runs the demo and returns the exit code: 0 when every invariant held,
// 1 when one failed or the demo could not run, 2 for bad flags.
func realMain(args []string, stdout, stderr io.Writer) int {
	cfg, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "demo:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := Run(ctx, cfg, stdout)
	if err != nil {
		fmt.Fprintln(stderr, "demo:", err)
		return 1
	}
	if !rep.OK() {
		fmt.Fprintln(stderr, "demo: an invariant failed (see the table above)")
		return 1
	}
	return 0
}

func parseFlags(args []string, stderr io.Writer) (Config, error) {
	var cfg Config
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: demo [flags]\n\nRuns orders -> outbox -> relay -> Kafka -> consumer -> inbox -> billing and checks\nexactly-once effects and per-key order. Flags:\n\n")
		fs.PrintDefaults()
	}
	defURL := os.Getenv("DATABASE_URL")
	if defURL == "" {
		defURL = DefaultDatabaseURL
	}
	var brokers string
	fs.IntVar(&cfg.Orders, "n", DefaultOrders, "number of orders to place")
	fs.IntVar(&cfg.Customers, "customers", DefaultCustomers, "number of customers (Kafka keys) the orders are spread over")
	fs.IntVar(&cfg.Producers, "producers", DefaultProducers, "concurrent goroutines placing orders")
	fs.IntVar(&cfg.Duplicates, "duplicates", DefaultDuplicates, "messages the demo delivers a second time (the inbox must suppress them)")
	fs.StringVar(&cfg.DatabaseURL, "database-url", defURL, "PostgreSQL URL (env DATABASE_URL)")
	fs.StringVar(&cfg.Schema, "schema", DefaultSchema, "PostgreSQL schema the demo drops and recreates")
	fs.StringVar(&brokers, "brokers", "", "Kafka seed brokers, comma separated (default: an embedded broker on a loopback port)")
	fs.StringVar(&cfg.Topic, "topic", "", "topic the orders are published to (default "+DefaultTopic+"; with --brokers a per-run suffix is added)")
	fs.IntVar(&cfg.Partitions, "partitions", DefaultPartitions, "partitions of the topic when the demo creates it")
	fs.BoolVar(&cfg.Avro, "avro", false, "publish Avro payloads (Confluent wire format) instead of JSON")
	fs.StringVar(&cfg.SchemaRegistryURL, "schema-registry", "", "schema registry URL for --avro (default: an embedded registry on a loopback port)")
	fs.DurationVar(&cfg.Timeout, "timeout", DefaultTimeout, "how long the demo waits for the pipeline to drain")
	fs.BoolVar(&cfg.Quiet, "quiet", false, "print only the final table")
	fs.StringVar(&cfg.ConsoleAddr, "console-addr", DefaultConsoleAddr, "address of the operator console and its admin API (empty disables)")
	fs.BoolVar(&cfg.Keep, "keep", false, "leave the pipeline and the console running after the report, until Ctrl-C")
	verbose := fs.Bool("v", false, "log the components' messages (relay, consumer) to stderr")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if brokers != "" {
		cfg.Brokers = strings.Split(brokers, ",")
	}
	level := slog.LevelWarn
	if *verbose {
		level = slog.LevelInfo
	}
	cfg.Logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	return cfg, nil
}
