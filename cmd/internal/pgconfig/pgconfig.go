// Package pgconfig builds the PostgreSQL connection configuration of the relay and consumer
// binaries, including the query execution mode that works behind PgBouncer in transaction
// pooling mode.
//
// pgx's default (QueryExecModeCacheStatement) prepares named statements on a connection and
// reuses them; behind PgBouncer in transaction mode the next transaction may run on another
// server connection, where the statement does not exist (SQLSTATE 26000, prepared statement
// "stmtcache_…" does not exist). With [Options.PgBouncer] the binaries use
// QueryExecModeCacheDescribe instead: every statement is parsed, bound and executed in one
// round trip on the unnamed statement, and only the statement's description (parameter and
// result types) is cached on the client, so no server-side state outlives a transaction.
package pgconfig

import (
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keiro-go/keiro/cmd/internal/cli"
)

// ExecModeParam is the connection-string parameter with which pgx reads its query execution
// mode (cache_statement, cache_describe, describe_exec, exec or simple_protocol).
const ExecModeParam = "default_query_exec_mode"

// Options are the connection choices the binaries expose as flags.
type Options struct {
	// PgBouncer makes every connection safe behind PgBouncer in transaction pooling mode: pgx's
	// statement cache is turned off and statements run in QueryExecModeCacheDescribe. A
	// default_query_exec_mode of describe_exec in the connection string wins; cache_statement
	// cannot work behind such a pooler and is refused. Defaults to false.
	PgBouncer bool
}

// Pooled reports whether connections are set up for a transaction-pooling PgBouncer: with
// [Options.PgBouncer], or when the connection string already picks a mode without named
// prepared statements (cache_describe or describe_exec), which is how a user says the same
// through the URL.
func (o Options) Pooled(dsn string) bool {
	if o.PgBouncer {
		return true
	}
	mode, ok := execModeOf(dsn)
	return ok && (mode == "cache_describe" || mode == "describe_exec")
}

// ParsePool parses dsn into a pool configuration with the options applied. Its errors never
// show dsn's secrets (cli.RedactError).
func (o Options) ParsePool(dsn string) (*pgxpool.Config, error) {
	if err := o.check(dsn); err != nil {
		return nil, err
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, cli.RedactError(err, cli.DSN(dsn))
	}
	o.apply(dsn, cfg.ConnConfig)
	return cfg, nil
}

// ParseConn parses dsn into a single connection's configuration with the options applied. Its
// errors never show dsn's secrets (cli.RedactError).
func (o Options) ParseConn(dsn string) (*pgx.ConnConfig, error) {
	if err := o.check(dsn); err != nil {
		return nil, err
	}
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, cli.RedactError(err, cli.DSN(dsn))
	}
	o.apply(dsn, cfg)
	return cfg, nil
}

// check refuses the modes keiro's statements cannot run in: exec and simple_protocol (they infer
// parameter types from Go types and cannot encode the typed arrays keiro passes), and
// cache_statement behind PgBouncer.
func (o Options) check(dsn string) error {
	mode, ok := execModeOf(dsn)
	if ok && (mode == "exec" || mode == "simple_protocol") {
		return fmt.Errorf("%s=%s cannot encode the typed parameters keiro's statements use: use cache_describe "+
			"(what --pgbouncer picks) or remove it from the connection URL", ExecModeParam, mode)
	}
	if !o.PgBouncer {
		return nil
	}
	if ok && mode == "cache_statement" {
		return fmt.Errorf("%s=cache_statement prepares named statements, which PgBouncer in transaction mode "+
			"does not keep between transactions: remove it from the connection URL (PgBouncer mode picks cache_describe)", ExecModeParam)
	}
	return nil
}

func (o Options) apply(dsn string, cfg *pgx.ConnConfig) {
	if !o.Pooled(dsn) {
		return
	}
	if _, ok := execModeOf(dsn); !ok {
		cfg.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe
	}
	cfg.StatementCacheCapacity = 0
}

// execModeOf returns the default_query_exec_mode of a connection string (URL or key=value).
func execModeOf(dsn string) (string, bool) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return "", false
	}
	// pgx consumes the parameter while parsing; read it back from the resulting mode only
	// when the string names it, so that the default is not mistaken for a choice.
	if !strings.Contains(dsn, ExecModeParam) {
		return "", false
	}
	switch cfg.DefaultQueryExecMode {
	case pgx.QueryExecModeCacheStatement:
		return "cache_statement", true
	case pgx.QueryExecModeCacheDescribe:
		return "cache_describe", true
	case pgx.QueryExecModeDescribeExec:
		return "describe_exec", true
	case pgx.QueryExecModeExec:
		return "exec", true
	case pgx.QueryExecModeSimpleProtocol:
		return "simple_protocol", true
	}
	return "", false
}
