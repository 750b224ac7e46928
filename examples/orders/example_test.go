package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/keiro-go/keiro/keirotest"
)

func Example() {
	ctx := context.Background()
	schema := fmt.Sprintf("orders_example_%d", time.Now().UnixNano())
	defer func() {
		if c, err := pgx.Connect(ctx, keirotest.DatabaseURL()); err == nil {
			_, _ = c.Exec(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE")
			_ = c.Close(ctx)
		}
	}()
	err := Run(ctx, Config{DatabaseURL: keirotest.DatabaseURL(), Schema: schema, OrderIDs: []string{"1001", "1002", "1003"}}, os.Stdout)
	if err != nil {
		fmt.Println(err)
	}
	// Output:
	// order#1     PlaceOrder  -> OrderPlaced (version 1)
	// order#2     PlaceOrder  -> OrderPlaced (version 1)
	// order#3     PlaceOrder  rejected: an order needs at least one item
	// order#1     PayOrder    -> OrderPaid (version 2)
	// order#1     PayOrder    no-op (version 2)
	// order#2     CancelOrder -> OrderCancelled (version 2)
	// order#2     PayOrder    rejected: cannot pay an order that is "cancelled"
	// outbox, waiting for the relay:
	//   ordering.orders.v1 key=order#1 OrderPlaced    pending {"orderId":"1001","customer":"ada","totalCents":3000}
	//   ordering.orders.v1 key=order#2 OrderPlaced    pending {"orderId":"1002","customer":"grace","totalCents":4200}
	//   ordering.orders.v1 key=order#1 OrderPaid      pending {"orderId":"1001","totalCents":3000}
	//   ordering.orders.v1 key=order#2 OrderCancelled pending {"orderId":"1002","reason":"changed mind"}
}
