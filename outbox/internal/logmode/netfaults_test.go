package logmode_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/keirotest/testenv/netproxy"
	"github.com/keiro-go/keiro/outbox"
	"github.com/keiro-go/keiro/outbox/internal/logmode"
	"github.com/keiro-go/keiro/outbox/internal/publish"
)

// TestConnectionCutMidStreamEndsTheSessionCleanly: the replication connection runs through a
// proxy, which cuts it (every connection, at the next byte the server sends) as the producer is
// handed the first record of a transaction, a few times over: the engine's read fails. pgconn closes a connection that
// failed on a goroutine of its own, writing a Terminate to it; the engine's last status report
// of the session must not write to that connection as well (pglogrepl writes to it past
// pgconn's state: a data race on its buffer, and a report that may seem to go out on a
// connection already given up). Each cut ends the session, the next one replays from the
// confirmed position, and every event is acknowledged. Run it with -race, as make test does.
func TestConnectionCutMidStreamEndsTheSessionCleanly(t *testing.T) {
	t.Parallel()
	f := newFixture(t, testenv.KafkaConfig{Topics: []string{"orders"}})
	ctx := context.Background()
	slot := f.db.Schema + "_keiro_log"
	cc := f.db.Pool.Config().ConnConfig
	pg := netproxy.New(t).Proxy(t, netproxy.ProxyConfig{Upstream: fmt.Sprintf("%s:%d", cc.Host, cc.Port)})
	url, err := pg.RewriteURL(f.db.ConnString)
	require.NoError(t, err)
	var armed atomic.Bool
	cuts := make(chan *netproxy.Toxic, 1)
	client := f.kafka.NewClient(t, append(outbox.ProducerOpts(), kgo.WithHooks(bufferedHook(func() {
		if armed.CompareAndSwap(true, false) {
			x, err := pg.Inject(netproxy.LimitData(0).Toward(netproxy.Downstream))
			if err != nil {
				t.Errorf("inject: %v", err)
			}
			cuts <- x
		}
	})))...)
	pub, err := publish.New(publish.Config{Client: client})
	require.NoError(t, err)
	e, err := logmode.New(url, pub, f.cfg)
	require.NoError(t, err)
	var sessions atomic.Int64
	acks := &testenv.Progress{}
	logmode.SetHooks(e, logmode.Hooks{
		OnActive: func() { sessions.Add(1) },
		OnAck:    func(string) { acks.Add(1) },
	})
	run(t, e)
	slotPID := func() int32 {
		var pid *int32
		require.NoError(t, f.db.Pool.QueryRow(ctx, `SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&pid))
		if pid == nil {
			return 0
		}
		return *pid
	}
	const rounds, perRound = 3, 400
	for i := range int64(rounds) {
		testenv.WaitFor(t, time.Minute, fmt.Sprintf("session %d replicating", i+1), func() bool {
			return sessions.Load() == i+1 && slotPID() != 0
		})
		pid := slotPID()
		armed.Store(true)
		evs := make([]event, perRound)
		for j := range evs {
			evs[j] = event{id: fmt.Sprintf("r%d-%02d", i, j), dest: "orders", key: fmt.Sprintf("k%d", j%5)}
		}
		commitEvents(t, f.db.Pool, evs[:perRound/2]...)
		commitEvents(t, f.db.Pool, evs[perRound/2:]...) // more of the stream behind the cut
		var x *netproxy.Toxic
		select {
		case x = <-cuts:
		case <-time.After(time.Minute):
			t.Fatalf("round %d: the transaction never reached the producer", i)
		}
		testenv.WaitFor(t, time.Minute, "the cut session to end", func() bool { return slotPID() != pid })
		require.NoError(t, x.Remove())
	}
	acks.Wait(t, rounds*perRound, time.Minute, nil)
	testenv.WaitFor(t, time.Minute, "a session after the last cut", func() bool { return sessions.Load() == rounds+1 })
}

// bufferedHook is a kgo hook calling f each time the producer is handed a record.
type bufferedHook func()

func (f bufferedHook) OnProduceRecordBuffered(*kgo.Record) { f() }
