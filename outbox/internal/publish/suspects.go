package publish

import "sync"

// Suspects are the records Kafka refused with a record-level error (too large, invalid) in a
// request that may have held other records of their partition: a poison record fails its
// bystanders. A suspect is produced alone next time, to learn whether it is the poison or a
// bystander. K identifies a record: the claim engine's outbox id, the log engine's message id.
type Suspects[K comparable] struct {
	mu  sync.Mutex
	ids map[K]struct{}
}

// Add makes id a suspect.
func (s *Suspects[K]) Add(id K) {
	s.mu.Lock()
	if s.ids == nil {
		s.ids = map[K]struct{}{}
	}
	s.ids[id] = struct{}{}
	s.mu.Unlock()
}

// Remove clears id.
func (s *Suspects[K]) Remove(id K) {
	s.mu.Lock()
	delete(s.ids, id)
	s.mu.Unlock()
}

// Has reports whether id is a suspect.
func (s *Suspects[K]) Has(id K) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.ids[id]
	return ok
}

// Take reports whether id is a suspect, and clears it.
func (s *Suspects[K]) Take(id K) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.ids[id]
	delete(s.ids, id)
	return ok
}
