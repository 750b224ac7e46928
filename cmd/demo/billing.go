package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/inbox"
	"github.com/keiro-go/keiro/outbox"
)

// The billing context's read model: one invoice per order, in the order billing applied them
// (applied_id), and a balance per customer. invoices has no unique key on order_id on purpose:
// a message applied twice would show as two rows.
func billingDDL(s string) string {
	return fmt.Sprintf(`
CREATE TABLE %[1]s.billing_invoices (
  applied_id   bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  order_id     text   NOT NULL,
  customer     text   NOT NULL,
  customer_seq bigint NOT NULL,
  amount       bigint NOT NULL,
  message_id   text   NOT NULL
);
CREATE TABLE %[1]s.billing_accounts (
  customer text PRIMARY KEY,
  invoices bigint NOT NULL,
  balance  bigint NOT NULL
);`, s)
}

// billingHandler applies an OrderPlaced event in the inbox transaction.
func billingHandler(s string) inbox.Handler {
	insert := `INSERT INTO ` + s + `.billing_invoices (order_id, customer, customer_seq, amount, message_id) VALUES ($1, $2, $3, $4, $5)`
	upsert := `INSERT INTO ` + s + `.billing_accounts AS a (customer, invoices, balance) VALUES ($1, 1, $2)
ON CONFLICT (customer) DO UPDATE SET invoices = a.invoices + 1, balance = a.balance + EXCLUDED.balance`
	return func(ctx context.Context, tx pgx.Tx, ev envelope.Event) error {
		var o OrderPlacedV1
		if err := json.Unmarshal(ev.Payload, &o); err != nil {
			return inbox.Permanent(fmt.Errorf("decode OrderPlaced %s: %w", ev.MessageID, err))
		}
		if o.OrderID == "" || o.Customer == "" || o.CustomerSeq < 1 {
			return inbox.Permanent(fmt.Errorf("OrderPlaced %s lacks order_id, customer or customer_seq", ev.MessageID))
		}
		if _, err := tx.Exec(ctx, insert, o.OrderID, o.Customer, o.CustomerSeq, o.Amount, ev.MessageID); err != nil {
			return fmt.Errorf("insert invoice %s: %w", o.OrderID, err)
		}
		if _, err := tx.Exec(ctx, upsert, o.Customer, o.Amount); err != nil {
			return fmt.Errorf("update account %s: %w", o.Customer, err)
		}
		return nil
	}
}

// Check is one line of the final table.
type Check struct {
	// Name says what is counted.
	Name string
	// Value is the figure.
	Value string
	// OK is false for a broken invariant; Informational lines are always OK.
	OK bool
	// Informational marks a figure that is not an invariant.
	Informational bool
}

// Report is the demo's result.
type Report struct {
	// Checks are the table's lines.
	Checks []Check
	// Elapsed is the time from the first order to the drained pipeline.
	Elapsed time.Duration
}

// OK reports whether every invariant held.
func (r *Report) OK() bool {
	for _, c := range r.Checks {
		if !c.OK {
			return false
		}
	}
	return true
}

// Print writes the table.
func (r *Report) Print(w io.Writer) {
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, c := range r.Checks {
		mark := "ok"
		switch {
		case c.Informational:
			mark = ""
		case !c.OK:
			mark = "FAILED"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", c.Name, c.Value, mark)
	}
	_ = tw.Flush()
	if r.OK() {
		fmt.Fprintf(w, "\nall invariants hold (%.1fs)\n", r.Elapsed.Seconds())
	}
}

// verify reads the outcome from PostgreSQL and checks the invariants.
func verify(ctx context.Context, pool *pgxpool.Pool, cfg Config, perCustomer map[string]int64, placed, injected int64,
	rs outbox.Stats, consumer *inbox.Consumer) (*Report, error) {
	ob, err := outbox.NewAdmin(cfg.Schema)
	if err != nil {
		return nil, err
	}
	st, err := ob.Overview(ctx, pool)
	if err != nil {
		return nil, fmt.Errorf("read the outbox status: %w", err)
	}
	var sent, notSent int64
	for _, c := range st.Counts {
		if c.Status == "sent" {
			sent += c.Count
		} else {
			notSent += c.Count
		}
	}
	var invoices, distinct, balance int64
	if err := pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT order_id), COALESCE(sum(amount), 0) FROM `+cfg.Schema+`.billing_invoices`).
		Scan(&invoices, &distinct, &balance); err != nil {
		return nil, fmt.Errorf("count invoices: %w", err)
	}
	var accounts int64
	if err := pool.QueryRow(ctx, `SELECT COALESCE(sum(balance), 0) FROM `+cfg.Schema+`.billing_accounts`).Scan(&accounts); err != nil {
		return nil, fmt.Errorf("sum balances: %w", err)
	}
	violations, err := orderViolations(ctx, pool, cfg.Schema, perCustomer)
	if err != nil {
		return nil, err
	}
	failed, err := consumer.Store().CountFailed(ctx, pool)
	if err != nil {
		return nil, fmt.Errorf("count failed inbox rows: %w", err)
	}
	cs := consumer.Stats()
	orderValue := fmt.Sprintf("%d customers", len(perCustomer))
	if len(violations) > 0 {
		orderValue = fmt.Sprintf("%d of %d customers out of order: %s", len(violations), len(perCustomer), strings.Join(violations, "; "))
	}
	return &Report{Checks: []Check{
		{Name: "orders placed", Value: fmt.Sprint(placed), OK: placed == int64(cfg.Orders)},
		{Name: "events published", Value: fmt.Sprint(sent), OK: sent == placed},
		{Name: "outbox rows not sent", Value: fmt.Sprint(notSent), OK: notSent == 0},
		{Name: "messages consumed", Value: fmt.Sprint(cs.Processed + cs.Duplicates), Informational: true, OK: true},
		{Name: "duplicates delivered on purpose", Value: fmt.Sprint(injected), Informational: true, OK: true},
		{Name: "duplicates suppressed", Value: fmt.Sprint(cs.Duplicates), OK: cs.Duplicates >= injected},
		{Name: "effects applied (invoices)", Value: fmt.Sprintf("%d (%d distinct orders)", invoices, distinct), OK: invoices == placed && distinct == placed},
		{Name: "balances match invoices", Value: fmt.Sprint(accounts), OK: accounts == balance},
		{Name: "per-key order verified", Value: orderValue, OK: len(violations) == 0},
		{Name: "inbox rows failed", Value: fmt.Sprint(failed), OK: failed == 0},
	}}, nil
}

// orderViolations checks that billing applied each customer's orders as 1, 2, 3, … up to the
// number the orders context committed, and describes the customers for which it did not.
func orderViolations(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, s string, perCustomer map[string]int64) ([]string, error) {
	rows, err := q.Query(ctx, `SELECT customer, customer_seq FROM `+s+`.billing_invoices ORDER BY applied_id`)
	if err != nil {
		return nil, fmt.Errorf("read invoices: %w", err)
	}
	applied := map[string][]int64{}
	for rows.Next() {
		var c string
		var seq int64
		if err := rows.Scan(&c, &seq); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read invoices: %w", err)
		}
		applied[c] = append(applied[c], seq)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read invoices: %w", err)
	}
	var out []string
	seen := map[string]bool{}
	check := func(c string) {
		seen[c] = true
		seqs := applied[c]
		if int64(len(seqs)) != perCustomer[c] {
			out = append(out, fmt.Sprintf("%s: %d applied, %d placed", c, len(seqs), perCustomer[c]))
			return
		}
		for i, s := range seqs {
			if s != int64(i+1) {
				out = append(out, fmt.Sprintf("%s: position %d applied seq %d", c, i+1, s))
				return
			}
		}
	}
	for c := range perCustomer {
		check(c)
	}
	for c := range applied {
		if !seen[c] {
			check(c)
		}
	}
	return out, nil
}

// redact hides the password of a database URL.
func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.User == nil {
		return raw
	}
	if _, ok := u.User.Password(); ok {
		u.User = url.UserPassword(u.User.Username(), "xxxxx")
	}
	return u.String()
}
