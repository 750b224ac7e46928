package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/keiro-go/keiro/cmd/internal/gctune"
)

func main() {
	gctune.Apply()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}
