package inbox

import "github.com/twmb/franz-go/pkg/kgo"

// SetPollHook makes c call hook after each poll, before dispatching the poll's records.
func SetPollHook(c *Consumer, hook func(kgo.Fetches)) { c.pollHook = hook }
