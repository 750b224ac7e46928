package console_test

import (
	"context"
	"fmt"
	"net/http"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keiro-go/keiro/console"
)

// A service that embeds the relay mounts the console on its own mux: open on loopback,
// token-protected when bound elsewhere.
func Example() {
	pool, err := pgxpool.New(context.Background(), "postgres://app@127.0.0.1:5432/app") // the service's pool
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()
	addr := "0.0.0.0:8080"
	var con *console.Console
	con, err = console.New(console.Config{
		Outbox: &console.OutboxConfig{Pool: pool, Schema: "keiro"},
		Auth:   console.AuthConfig{Token: "from-a-secret", AllowUnauthenticated: console.IsLoopback(addr)},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	mux := http.NewServeMux()
	mux.Handle("/api/v1/", con)
	mux.Handle("/console/", con)
	fmt.Println("mounted")
	// Output: mounted
}

func ExampleIsLoopback() {
	fmt.Println(console.IsLoopback("127.0.0.1:9464"), console.IsLoopback("0.0.0.0:9464"), console.IsLoopback("[::1]:9464"))
	// Output: true false true
}
