// Package migrations holds keiro's embedded, versioned SQL and applies it: it is the one place
// a program migrates keiro's schema from ([Migrate], [GetStatus], [Latest]).
//
// All tables live in one PostgreSQL schema (default "keiro", configurable and validated by
// [ValidateSchema]). The migration files under sql/ are numbered and applied in order by
// [Migrate] under an advisory lock, each in its own transaction; the applied version is
// recorded in <schema>.keiro_schema_version. Applying twice is a no-op, and several processes
// migrating at once apply each migration exactly once. The files use {{.schema}} for the schema
// name.
//
// The runner is github.com/jackc/tern, so only code that migrates links it: the library
// packages (outbox, inbox, events) do not import this package, and a service that leaves
// migrating to `relay migrate` carries none of it. The relay and consumer binaries run the same
// code as `relay migrate` and `consumer migrate` (and --migrate at startup); keirotest migrates
// each test's schema with it.
package migrations
