package buffer

import (
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
)

func records(n int, value []byte) []*kgo.Record {
	recs := make([]*kgo.Record, n)
	for i := range recs {
		recs[i] = &kgo.Record{Value: value, Offset: int64(i)}
	}
	return recs
}

// TestInProgressRecordsCountAgainstTheBounds: a batch taken for processing still counts
// against the bounds until it is finished, so a partition holds at most its bounds in all
// (buffered and in progress), not a full buffer plus a batch. A batch takes at most a quarter
// of the bytes bound.
func TestInProgressRecordsCountAgainstTheBounds(t *testing.T) {
	t.Parallel()
	value := make([]byte, 410)
	for _, tc := range []struct {
		name   string
		limits Limits
		value  []byte
		batch  int // records that Take(6) returns
	}{
		// Ten records fill the bytes bound; a batch takes at most a quarter of it: two records.
		{"bytes", Limits{Records: 1000, Bytes: 10 * RecordBytes(&kgo.Record{Value: value})}, value, 2},
		{"records", Limits{Records: 10, Bytes: 1 << 30}, []byte("x"), 6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := New(tc.limits)
			recs := records(10, tc.value)
			b.Push(recs)
			require.Equal(t, State{Full: true}, b.State(), "ten records fill the buffer")

			batch := b.Take(6)
			require.Len(t, batch, tc.batch)
			require.True(t, b.Full(), "the records in progress still count")
			held, heldBytes := b.Held()
			require.Equal(t, tc.batch, held)
			require.Equal(t, tc.batch*RecordBytes(recs[0]), heldBytes)

			resume, room := b.Finish(batch)
			require.False(t, resume, "a buffer that was not paused is not resumed")
			require.True(t, room, "a finished batch makes room")
			for taken := len(batch); taken < len(recs); {
				rest := b.Take(10)
				require.NotEmpty(t, rest)
				require.Equal(t, recs[taken].Offset, rest[0].Offset, "in offset order")
				taken += len(rest)
				b.Finish(rest)
			}
			require.Equal(t, State{Empty: true}, b.State())
			held, heldBytes = b.Held()
			require.Zero(t, held)
			require.Zero(t, heldBytes)
			require.Nil(t, b.Take(10), "an empty buffer gives nothing")
		})
	}
}

// TestALargeRecordIsTakenAlone: a record larger than a batch's share of the bytes bound is
// still taken, alone, so that it is processed rather than stuck.
func TestALargeRecordIsTakenAlone(t *testing.T) {
	t.Parallel()
	b := New(Limits{Records: 100, Bytes: 4096})
	b.Push(records(3, make([]byte, 2048)))
	require.Len(t, b.Take(3), 1)
	require.Nil(t, New(Limits{Records: 1, Bytes: 1}).Take(1))
	require.Nil(t, b.Take(0), "n < 1 takes nothing")
}

// TestTakeDropsTheBuffersReferences: a taken record is no longer referenced by the buffer's
// backing array, so it is garbage once its batch is finished.
func TestTakeDropsTheBuffersReferences(t *testing.T) {
	t.Parallel()
	b := New(Limits{Records: 100, Bytes: 1 << 30})
	b.Push(records(4, []byte("x")))
	backing := b.queue[:4]
	got := b.Take(2)
	require.Len(t, got, 2)
	require.Nil(t, backing[0])
	require.Nil(t, backing[1])
	require.Equal(t, int64(0), got[0].Offset)
	require.Equal(t, 2, b.Len())
}

// TestPauseAndResume: only a full, unpaused buffer pauses; a paused one resumes once it holds
// no more than half its bounds, counting the records in progress.
func TestPauseAndResume(t *testing.T) {
	t.Parallel()
	b := New(Limits{Records: 8, Bytes: 1 << 30})
	b.Push(records(7, []byte("x")))
	require.False(t, b.Pause(), "a buffer below its bounds does not pause")
	b.Push(records(1, []byte("x")))
	require.True(t, b.Pause())
	require.False(t, b.Pause(), "a paused buffer pauses once")
	require.Equal(t, State{Full: true, Paused: true}, b.State())

	first := b.Take(3)
	resume, room := b.Finish(first[:1])
	require.False(t, resume, "7 records held (5 buffered, 2 in progress) are more than half")
	require.True(t, room)
	resume, _ = b.Finish(first[1:])
	require.False(t, resume, "5 records held are more than half")
	resume, _ = b.Finish(b.Take(1))
	require.True(t, resume, "4 records held are half")
	require.False(t, b.State().Paused)
	require.False(t, b.Unpause(), "a resumed buffer is not paused")

	b.Push(records(4, []byte("x")))
	require.True(t, b.Pause())
	require.True(t, b.Unpause(), "a stopping worker resumes its paused partition")
}

// TestDecide: the poll loop polls while no unpaused buffer is full, holds while every other
// partition still has records, and pauses the full ones once another has run dry.
func TestDecide(t *testing.T) {
	t.Parallel()
	full, busy, dry, paused := State{Full: true}, State{}, State{Empty: true}, State{Full: true, Paused: true}
	for _, tc := range []struct {
		name   string
		states []State
		action Action
		full   []int
	}{
		{"no partitions", nil, Poll, nil},
		{"room everywhere", []State{busy, dry}, Poll, nil},
		{"only paused ones full", []State{paused, dry}, Poll, nil},
		{"full, others busy", []State{busy, full, busy}, Hold, []int{1}},
		{"full alone", []State{full}, Hold, []int{0}},
		{"full, another dry", []State{full, busy, dry, full}, PauseFull, []int{0, 3}},
		// A full buffer whose records are all in progress is empty too; it is not dry for
		// the others (it is full), and it is paused when another partition is dry.
		{"full and in progress", []State{{Full: true, Empty: true}, busy}, Hold, []int{0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			action, idx := Decide(tc.states)
			require.Equal(t, tc.action, action, "%s", action)
			require.Equal(t, tc.full, idx)
		})
	}
	require.Equal(t, "hold", Hold.String())
}
