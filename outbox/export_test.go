package outbox

// EnqueuesInLogMode reports whether s's next enqueue runs log mode's statement (Store.insert).
func EnqueuesInLogMode(s *Store) bool { return s.logEnqueue.Load() }
