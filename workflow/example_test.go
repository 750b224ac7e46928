package workflow_test

import (
	"context"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5"

	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/workflow"
)

// Register a workflow, start it in a transaction, let it park on an approval, approve it from
// elsewhere, and run it to completion.
func Example() {
	db, dropDB := testenv.NewExampleDB()
	defer dropDB()
	ctx := context.Background()
	e, err := workflow.New(db.Pool, workflow.Config{Schema: db.Schema})
	if err != nil {
		log.Fatal(err)
	}
	refund, err := workflow.Register(e, "refund", func(c *workflow.Context, amount int) (string, error) {
		// A step: its writes through tx commit once, with its journal entry.
		ticket, err := workflow.Step(c, "open-ticket", func(ctx context.Context, tx pgx.Tx) (string, error) {
			return fmt.Sprintf("T-%d", amount), nil
		})
		if err != nil {
			return "", err
		}
		// Parks the instance until someone records "approved".
		approver, err := workflow.Await[string](c, "approved")
		if err != nil {
			return "", err
		}
		return ticket + " approved by " + approver, nil
	})
	if err != nil {
		log.Fatal(err)
	}
	err = pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		_, err := refund.StartTx(ctx, tx, "order-7", 120) // commits with the caller's writes
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
	out, _ := refund.Run(ctx, "order-7") // a Worker does this in a service
	fmt.Println(out)
	err = pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		_, err := e.CompleteStepTx(ctx, tx, "refund", "order-7", "approved", "ana")
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
	out, _ = refund.Run(ctx, "order-7")
	result, _, _, _ := refund.Result(ctx, db.Pool, "order-7")
	fmt.Println(out, result)
	// Output:
	// suspended
	// completed T-120 approved by ana
}
