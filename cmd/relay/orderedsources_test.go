package main

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/outbox"
)

// A per-source relay declares --ordered-sources before it starts publishing; one that finds no
// source declared warns that its order is not commit order.
func TestRunDeclaresOrderedSources(t *testing.T) {
	t.Parallel()
	kc := testenv.NewKafka(t)
	db := testenv.NewDB(t)
	p := start(t, nil, "--database-url="+testenv.DatabaseURL(), "--schema="+db.Schema, "--brokers="+kc.Seeds[0],
		"--http-addr=", "--policy=per-source", "--ordered-sources=ledger,audit")
	p.waitLine(t, regexpMust(`per-source ordered sources.*audit.*ledger`), 30*time.Second)
	st, err := outbox.NewAdmin(db.Schema)
	if err != nil {
		t.Fatal(err)
	}
	got, err := st.PerSourceOrdered(context.Background(), db.Pool)
	if err != nil || !slices.Equal(got, []string{"audit", "ledger"}) {
		t.Fatalf("declared sources %q (err %v)", got, err)
	}

	bare := testenv.NewDB(t)
	p = start(t, nil, "--database-url="+testenv.DatabaseURL(), "--schema="+bare.Schema, "--brokers="+kc.Seeds[0],
		"--http-addr=", "--policy=per-source")
	p.waitLine(t, regexpMust(`no source is declared ordered`), 30*time.Second)
}
