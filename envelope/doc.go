// Package envelope defines the integration event ([Event]) and its Kafka wire contract: the
// 19 keiro headers, their order and value formats, decoding with keiro's check order and typed
// errors, and an optional CloudEvents binary-mode profile.
//
// The record key is the event's Key and the record value is its Payload; everything else
// travels in headers, byte-compatible with the Haskell library keiro, so a keiro consumer
// decodes records produced here and this package decodes theirs.
//
// The package depends on the standard library only.
package envelope
