package logmode

// The engine's statements. They run on the replication connection (replication=database
// accepts plain SQL in the simple query protocol, which has no parameters). The publication's
// and the slot's are logslot's (SQLPublication, SQLSlot, SQLCreatePublication), shared with
// the Store; the names placed into them are validated identifiers (Config.validate), never
// quoted user text.

// sqlRowFilters tells whether the server has publication row filters (PostgreSQL 15).
const sqlRowFilters = `SELECT current_setting('server_version_num')::int >= 150000`
