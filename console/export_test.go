package console

// LoopbackHost exports loopbackHost to the tests.
var LoopbackHost = loopbackHost

// APIPatterns exports the registered /api/v1 routes to the tests.
func (c *Console) APIPatterns() []string { return c.apiPatterns }

// SetFetchHook makes c tell hook the bytes of each Fetch answer it reads from a dead-letter
// topic.
func SetFetchHook(c *Console, hook func(bytes int)) { c.fetched = hook }
