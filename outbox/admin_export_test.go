package outbox

// AdminOf returns the Admin of st's schema, for tests that hold a Store.
func AdminOf(st *Store) *Admin {
	a, err := NewAdmin(st.Schema())
	if err != nil {
		panic(err)
	}
	return a
}
