// Command apicurio fetches and runs the schema registry of keiro-go's test suite (Apicurio
// Registry, Confluent-compatible API).
//
//	go run ./keirotest/testenv/internal/apicurio/cmd/apicurio fetch   # download and unpack (once per machine)
//	go run ./keirotest/testenv/internal/apicurio/cmd/apicurio run
//	go run ./keirotest/testenv/internal/apicurio/cmd/apicurio fetch 2.6.13.Final   # one release; prints its directory
//
// fetch downloads every release the machine's newest Java runs. run starts the release the
// tests start (Apicurio Registry 3.3.3 on Java 21+, else 2.6.13.Final on Java 17) on
// loopback, prints KEIRO_TEST_SCHEMA_REGISTRY_URL=… for the tests to use, and stops
// it on SIGINT or SIGTERM.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/keiro-go/keiro/keirotest/testenv/internal/apicurio"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "apicurio:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) == 2 && args[0] == "fetch" {
		// One release, whatever Java the machine has (an image that brings its own): prints
		// the unpacked release's directory.
		for _, rel := range apicurio.Releases {
			if rel.Version == args[1] {
				dir, err := apicurio.Fetch(context.Background(), rel)
				if err != nil {
					return err
				}
				fmt.Println(dir)
				return nil
			}
		}
		return fmt.Errorf("unknown release %q", args[1])
	}
	if len(args) != 1 {
		return fmt.Errorf("usage: apicurio fetch [version] | run")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	switch args[0] {
	case "fetch":
		// Every release the machine's newest Java runs: the tests start the first, and the
		// package's own tests the others too.
		javas, err := apicurio.FindJavas(ctx)
		if err != nil {
			return err
		}
		for _, rel := range apicurio.Releases {
			_, java, err := apicurio.Choose(rel.Version, javas)
			if err != nil {
				fmt.Printf("Apicurio Registry %s: not fetched (%v)\n", rel.Version, err)
				continue
			}
			start := time.Now()
			dir, err := apicurio.Fetch(ctx, rel)
			if err != nil {
				return err
			}
			fmt.Printf("Apicurio Registry %s for Java %d (%s): %s (%s)\n", rel.Version, java.Major, java.Path, dir,
				time.Since(start).Round(time.Millisecond))
		}
		return nil
	case "run":
		start := time.Now()
		r, err := apicurio.Start(ctx, apicurio.Config{})
		if err != nil {
			return err
		}
		defer r.Close()
		fmt.Fprintf(os.Stderr, "Apicurio Registry %s on Java %d answered after %s; log %s\n", r.Release.Version, r.Java.Major,
			time.Since(start).Round(time.Millisecond), r.LogPath())
		fmt.Printf("KEIRO_TEST_SCHEMA_REGISTRY_URL=%s\n", r.URL)
		<-ctx.Done()
		return nil
	}
	return fmt.Errorf("unknown command %q: fetch or run", args[0])
}
