// Package migrations holds keiro's embedded, versioned SQL and applies it.
//
// All tables live in one PostgreSQL schema (default "keiro", configurable and validated). The
// migration files under sql/ are numbered and applied in order by [Migrate] under an advisory
// lock, each in its own transaction; the applied version is recorded in
// <schema>.keiro_schema_version. Applying twice is a no-op, and several processes migrating at
// once apply each migration exactly once. The files use {{.schema}} for the schema name.
//
// The relay and consumer binaries run the same code as `relay migrate` and `consumer migrate`.
package migrations
