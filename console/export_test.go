package console

// LoopbackHost exports loopbackHost to the tests.
var LoopbackHost = loopbackHost

// APIPatterns exports the registered /api/v1 routes to the tests.
func (c *Console) APIPatterns() []string { return c.apiPatterns }
