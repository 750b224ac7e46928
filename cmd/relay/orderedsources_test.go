package main

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/keiro-go/keiro/internal/testdb"
	"github.com/keiro-go/keiro/internal/testkafka"
	"github.com/keiro-go/keiro/outbox"
)

// A per-source relay declares --ordered-sources before it starts publishing; one that finds no
// source declared warns that its order is not commit order.
func TestRunDeclaresOrderedSources(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t)
	db := testdb.New(t)
	p := start(t, nil, "--database-url="+testdb.URL(), "--schema="+db.Schema, "--brokers="+kc.Brokers[0],
		"--http-addr=", "--policy=per-source", "--ordered-sources=ledger,audit")
	p.waitLine(t, regexpMust(`per-source ordered sources.*audit.*ledger`), 30*time.Second)
	st, err := outbox.NewStore(db.Schema)
	if err != nil {
		t.Fatal(err)
	}
	got, err := st.PerSourceOrdered(context.Background(), db.Pool)
	if err != nil || !slices.Equal(got, []string{"audit", "ledger"}) {
		t.Fatalf("declared sources %q (err %v)", got, err)
	}

	bare := testdb.New(t)
	p = start(t, nil, "--database-url="+testdb.URL(), "--schema="+bare.Schema, "--brokers="+kc.Brokers[0],
		"--http-addr=", "--policy=per-source")
	p.waitLine(t, regexpMust(`no source is declared ordered`), 30*time.Second)
}
