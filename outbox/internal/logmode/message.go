package logmode

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/outbox/internal/kafkaerr"
	"github.com/keiro-go/keiro/outbox/internal/logmsg"
)

// The decoding of the events Store.EmitTx writes as transactional logical decoding messages
// (logmsg). pgoutput sends them, with messages 'true', as 'M' messages in their transaction,
// in commit order with the transaction's inserts, whatever the publication: the stream keeps
// those of its schema's prefix, decodes their content with the row decoder (msgLayout) and
// publishes them as it publishes rows.

// msgLayout is the layout of a message's content: logmsg.Columns, in their order.
var msgLayout = func() *layout {
	rel := &pglogrepl.RelationMessage{Namespace: "logical message", RelationName: "content"}
	for _, c := range logmsg.Columns {
		rel.Columns = append(rel.Columns, &pglogrepl.RelationMessageColumn{Name: c.Name, DataType: c.OID})
	}
	l, err := newLayout(rel)
	if err != nil {
		panic(err) // logmsg.Columns and columns disagree: a programmer's error
	}
	l.what = "emitted event"
	return l
}()

// logicalMessage is a pgoutput Message ('M', protocol version 1): its flags, its LSN, its
// prefix and its content (both in the connection's read buffer).
type logicalMessage struct {
	transactional bool
	lsn           pglogrepl.LSN
	prefix        []byte
	content       []byte
}

// parseMessage cuts a pgoutput 'M' message (data, with its type byte) in place: flags (1 byte),
// LSN (8), the prefix (a C string), the content's length (4) and the content.
func parseMessage(data []byte) (logicalMessage, error) {
	var m logicalMessage
	if len(data) < 10 {
		return m, fmt.Errorf("logical message of %d bytes", len(data))
	}
	m.transactional = data[1]&1 == 1
	m.lsn = pglogrepl.LSN(binary.BigEndian.Uint64(data[2:]))
	rest := data[10:]
	end := bytes.IndexByte(rest, 0)
	if end < 0 {
		return m, errors.New("logical message: prefix without its terminating NUL")
	}
	m.prefix, rest = rest[:end], rest[end+1:]
	if len(rest) < 4 {
		return m, errors.New("logical message: no content length")
	}
	n := binary.BigEndian.Uint32(rest)
	if uint64(n) != uint64(len(rest)-4) {
		return m, fmt.Errorf("logical message: content of %d bytes, the message has %d", n, len(rest)-4)
	}
	m.content = rest[4:]
	return m, nil
}

// decodeMessage decodes a message's content into a row. A content that is not a known format
// or whose tuple is broken is an error; a whole tuple whose values do not make an event is a
// badRowError, as for a row, with what decoded.
func decodeMessage(content []byte) (*row, error) {
	tuple, err := logmsg.Tuple(content)
	if err != nil {
		return nil, err
	}
	r, err := msgLayout.row(tuple)
	var bad *badRowError
	if err != nil && !errors.As(err, &bad) {
		return nil, fmt.Errorf("format %d: %w", logmsg.Version, err)
	}
	return r, err
}

// undecodableMessage is the event a dead letter keeps of a message whose content does not
// decode: the content as its payload, under a message id made of its LSN (the same at every
// replay, so the dead letter is written once), the prefix as its source, no destination.
func undecodableMessage(m logicalMessage, at time.Time) *row {
	r := &row{}
	r.ev = envelope.Event{
		MessageID:   fmt.Sprintf("logical-message/%s", m.lsn),
		Source:      string(m.prefix),
		EventType:   "undecodable",
		ContentType: "application/octet-stream",
		Payload:     slices.Clone(m.content),
		OccurredAt:  at,
	}
	if r.ev.Payload == nil {
		r.ev.Payload = []byte{}
	}
	return r
}

// logicalMessage handles a pgoutput 'M' message: a transactional message of the stream's prefix is
// an event, produced like an inserted row; one whose content does not decode is rejected with
// kafkaerr.CodeUndecodableMessage (its dead letter written, the stream moves on). Messages of
// other prefixes are skipped; a non-transactional message of the prefix (EmitTx never writes
// one) has no transaction to be confirmed with: it is logged and skipped.
func (s *stream) logicalMessage(ctx context.Context, data []byte) error {
	m, err := parseMessage(data)
	if err != nil {
		return fmt.Errorf("decode pgoutput message: %w", err)
	}
	if string(m.prefix) != s.prefix {
		return nil
	}
	if !m.transactional {
		s.e.log.ErrorContext(ctx, "log mode: a non-transactional logical message of the outbox's prefix is not an event; write events with Store.EmitTx (transactional messages)",
			"prefix", s.prefix, "lsn", m.lsn.String(), "bytes", len(m.content))
		return nil
	}
	if s.tx == nil {
		return errors.New("replication: transactional message outside a transaction")
	}
	if s.skip {
		return nil // in Kafka already (exactly once)
	}
	r, err := decodeMessage(m.content)
	var bad *badRowError
	switch {
	case errors.As(err, &bad):
		r = bad.r
	case err != nil:
		// Not even the destination is known: every slot of the schema dead-letters it, under
		// the same identity, so it is written once.
		r = undecodableMessage(m, s.tx.at)
		err = fmt.Errorf("decode the logical message at %s of prefix %q: %w", m.lsn, s.prefix, err)
		s.w.add(s.tx, 0, false)
		s.reject(s.tx, 0, &r.ev, kafkaerr.CodeUndecodableMessage, err, false)
		return nil
	}
	if len(s.e.cfg.Destinations) > 0 && !slices.Contains(s.e.cfg.Destinations, r.ev.Destination) {
		// Another slot's: messages are not filtered by the publication.
		return nil
	}
	if bad != nil {
		err := fmt.Errorf("the logical message at %s of prefix %q: %w", m.lsn, s.prefix, bad.err)
		s.w.add(s.tx, 0, false)
		s.reject(s.tx, 0, &r.ev, kafkaerr.CodeUndecodableMessage, err, false)
		return nil
	}
	return s.produce(ctx, s.tx, r)
}
