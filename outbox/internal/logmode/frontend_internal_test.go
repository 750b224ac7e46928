package logmode

import (
	"bytes"
	"io"
	"testing"

	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/outbox/internal/logsource"
	"github.com/keiro-go/keiro/outbox/internal/publish"
)

// countingReader counts the reads of its reader: each is a system call on a connection.
type countingReader struct {
	r     io.Reader
	reads int
}

func (c *countingReader) Read(p []byte) (int, error) {
	c.reads++
	return c.r.Read(p)
}

// The replication connection reads a backlog of rows in a few large reads, not 8 KiB at a
// time: 200 messages of a 1 KiB row (about 300 KiB) take two reads, where pgproto3's own
// buffer takes about forty. Every message arrives whole and in order.
func TestReplicationConnectionReadsBacklogInLargeReads(t *testing.T) {
	client, err := kgo.NewClient(kgo.SeedBrokers("127.0.0.1:1"), kgo.RequiredAcks(kgo.AllISRAcks()), kgo.ManualFlushing())
	require.NoError(t, err)
	t.Cleanup(client.Close)
	pub, err := publish.New(publish.Config{Client: client})
	require.NoError(t, err)
	e, err := New("postgres://postgres@127.0.0.1:5432/postgres", pub, logsource.Config{Schema: "keiro", Slot: "s", Publication: "p"})
	require.NoError(t, err)

	const n = 200
	var wire []byte
	for i := range n {
		data := bytes.Repeat([]byte{byte(i)}, 1500)
		wire, err = (&pgproto3.CopyData{Data: data}).Encode(wire)
		require.NoError(t, err)
	}
	conn := &countingReader{r: bytes.NewReader(wire)}
	fe := e.conn.BuildFrontend(conn, io.Discard)
	for i := range n {
		msg, err := fe.Receive()
		require.NoError(t, err)
		cd, ok := msg.(*pgproto3.CopyData)
		require.True(t, ok, "message %d is %T", i, msg)
		require.Equal(t, bytes.Repeat([]byte{byte(i)}, 1500), cd.Data, "message %d", i)
	}
	require.LessOrEqual(t, conn.reads, 2)
}
