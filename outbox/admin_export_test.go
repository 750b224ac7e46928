package outbox

// AdminOf returns the Admin of st's schema, with st's test hooks, for tests that hold a Store.
func AdminOf(st *Store) *Admin { return adminOf(st) }
