package handlers

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/inbox"
)

// PermanentSQLState is the SQLSTATE a function raises to poison the message it was given:
//
//	RAISE EXCEPTION 'unknown customer %', doc->>'key' USING ERRCODE = 'KP001';
//
// Class 22 (data exception) errors are permanent too; every other error is retried.
const PermanentSQLState = "KP001"

var identifier = `[A-Za-z_][A-Za-z0-9_$]{0,62}`

// functionName matches "name" or "schema.name", each part a plain SQL identifier.
var functionName = regexp.MustCompile(`^(` + identifier + `)(?:\.(` + identifier + `))?$`)

// SQLConfig configures [NewSQL].
type SQLConfig struct {
	// Function is the PostgreSQL function called as SELECT <Function>($1::jsonb) with the
	// event's [Document]: "name" or "schema.name", each part a plain identifier (letters,
	// digits, _ and $). Parts are quoted as given, so they are case-sensitive; an unqualified
	// name is resolved through the connection's search_path, so prefer qualifying it.
	// Required.
	Function string
	// DecodePayload turns non-JSON payloads (Avro) into JSON. Defaults to nil: non-JSON
	// payloads are passed as base64 with "payload_encoding": "base64".
	DecodePayload PayloadDecoder
}

func (c *SQLConfig) validate() error {
	if c.Function == "" {
		return errors.New("Function is required")
	}
	if !functionName.MatchString(c.Function) {
		return fmt.Errorf("Function %q is not a [schema.]name of plain identifiers (letters, digits, _ and $, at most 63 bytes each)", c.Function)
	}
	return nil
}

// SQL calls a PostgreSQL function inside the inbox transaction, so the function's writes and
// the inbox row commit together: exactly-once effects (see the package doc).
type SQL struct {
	query  string
	decode PayloadDecoder
}

// NewSQL validates cfg and returns the handler.
func NewSQL(cfg SQLConfig) (*SQL, error) {
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("sql handler config: %w", err)
	}
	m := functionName.FindStringSubmatch(cfg.Function)
	id := pgx.Identifier{m[1]}
	if m[2] != "" {
		id = pgx.Identifier{m[1], m[2]}
	}
	return &SQL{query: "SELECT " + id.Sanitize() + "($1::jsonb)", decode: cfg.DecodePayload}, nil
}

// Query returns the statement the handler runs, for logs and docs.
func (s *SQL) Query() string { return s.query }

// Handle calls the function with ev's document in tx. It has the inbox Handler signature.
func (s *SQL) Handle(ctx context.Context, tx pgx.Tx, ev envelope.Event) error {
	doc, err := s.document(ctx, ev)
	if err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, s.query, doc); err != nil {
		return s.callError(ev, err)
	}
	return nil
}

// HandleBatch calls the function once per event, in order, in tx, sending all the calls in one
// round trip (a pgx batch). It has the inbox BatchHandler signature: with the consumer's
// BatchSize above 1 the effects of a whole batch cost one round trip and one commit. The first
// failing call's error is returned, classified as by Handle; the inbox then rolls the batch back
// and re-runs its events one by one, so a poison message never discards its batch mates.
func (s *SQL) HandleBatch(ctx context.Context, tx pgx.Tx, evs []envelope.Event) error {
	if len(evs) == 1 {
		return s.Handle(ctx, tx, evs[0])
	}
	b := &pgx.Batch{}
	for _, ev := range evs {
		doc, err := s.document(ctx, ev)
		if err != nil {
			return err
		}
		b.Queue(s.query, doc)
	}
	br := tx.SendBatch(ctx, b)
	for _, ev := range evs {
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			return s.callError(ev, err)
		}
	}
	if err := br.Close(); err != nil {
		return fmt.Errorf("call %s for a batch of %d: %w", s.function(), len(evs), err)
	}
	return nil
}

// document is ev's document as text; MarshalDocument classifies its errors.
func (s *SQL) document(ctx context.Context, ev envelope.Event) (string, error) {
	doc, err := MarshalDocument(ctx, ev, s.decode)
	if err != nil {
		return "", err
	}
	return string(doc), nil
}

// callError wraps the error of the call for ev and classifies it.
func (s *SQL) callError(ev envelope.Event, err error) error {
	err = fmt.Errorf("call %s for message %q: %w", s.function(), ev.MessageID, err)
	switch {
	case IsPermanentSQLError(err):
		return inbox.Permanent(err)
	case isUndefinedFunction(err):
		// The handler's function is missing (being replaced by a deploy, or dropped): an
		// outage of the handler, not a fault of the message; no attempt is used until it is
		// back.
		return inbox.Outage(err)
	}
	return err
}

// isUndefinedFunction reports SQLSTATE 42883 (undefined_function) raised by the handler's own
// statement: the function it calls does not exist. The same code raised inside the function's
// body (a call it makes, perhaps chosen by the document) has a context (Where) and may recur
// for the same message, so it is an ordinary failure that uses attempts.
func isUndefinedFunction(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "42883" && pe.Where == ""
}

// function is the quoted function name of the query.
func (s *SQL) function() string {
	return s.query[len("SELECT "):strings.IndexByte(s.query, '(')]
}

// IsPermanentSQLError reports whether err carries a PostgreSQL error that the same input will
// always produce: SQLSTATE [PermanentSQLState] or class 22 (data exception).
func IsPermanentSQLError(err error) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return false
	}
	return pe.Code == PermanentSQLState || strings.HasPrefix(pe.Code, "22")
}
