// Command build builds kube-apiserver once per machine (see apiserver.Build) and prints the
// binary's path; .ci/run and `make deploy-check` call it so that the long cold build happens
// outside a test's timeout.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"time"

	"github.com/keiro-go/keiro/deploy/kubernetes/validate/internal/apiserver"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	start := time.Now()
	bin, err := apiserver.Build(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Fprintf(os.Stderr, "kube-apiserver %s ready in %s\n", apiserver.Version, time.Since(start).Round(time.Second))
	fmt.Println(bin)
}
