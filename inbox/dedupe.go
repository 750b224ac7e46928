package inbox

import (
	"fmt"
	"strconv"
)

type dedupeKind int

const (
	dedupeMessageID dedupeKind = iota
	dedupeSourceEventIdentity
	dedupeKafkaDelivery
	dedupeCustom
)

// DedupePolicy computes the dedupe key of a delivery: the third component of the inbox primary
// key (consumer, source, dedupe_key), where source is the event's Source. The zero value is
// [DedupeMessageID].
type DedupePolicy struct {
	kind dedupeKind
	fn   func(Delivery) (string, error)
}

var (
	// DedupeMessageID keys on the event's MessageID (keiro's PreferIntegrationMessageId): a
	// republished copy of the same message is a duplicate wherever it lands. The default.
	DedupeMessageID = DedupePolicy{kind: dedupeMessageID}
	// DedupeSourceEventIdentity keys on the producing private event: SourceEventID as a
	// lowercase UUID, else SourceGlobalPosition in decimal. Two messages with different ids
	// derived from the same private event are duplicates.
	DedupeSourceEventIdentity = DedupePolicy{kind: dedupeSourceEventIdentity}
	// DedupeKafkaDelivery keys on the Kafka coordinates "topic:partition:offset": only
	// redeliveries of the same record are duplicates, republished copies are not.
	DedupeKafkaDelivery = DedupePolicy{kind: dedupeKafkaDelivery}
)

// DedupeCustom keys with fn. An empty key or an error from fn makes the policy unsatisfied.
func DedupeCustom(fn func(Delivery) (string, error)) DedupePolicy {
	return DedupePolicy{kind: dedupeCustom, fn: fn}
}

// String names the policy.
func (p DedupePolicy) String() string {
	switch p.kind {
	case dedupeSourceEventIdentity:
		return "SourceEventIdentity"
	case dedupeKafkaDelivery:
		return "KafkaDelivery"
	case dedupeCustom:
		return "Custom"
	default:
		return "MessageID"
	}
}

// Key computes the dedupe key of d, or returns a *[DedupePolicyError].
func (p DedupePolicy) Key(d Delivery) (string, error) {
	unsatisfied := func(reason string) (string, error) {
		return "", &DedupePolicyError{Policy: p.String(), Reason: reason}
	}
	switch p.kind {
	case dedupeMessageID:
		if d.Event.MessageID == "" {
			return unsatisfied("the event has no message id")
		}
		return d.Event.MessageID, nil
	case dedupeSourceEventIdentity:
		if d.Event.SourceEventID != nil {
			return d.Event.SourceEventID.String(), nil
		}
		if d.Event.SourceGlobalPosition != nil {
			return strconv.FormatInt(*d.Event.SourceGlobalPosition, 10), nil
		}
		return unsatisfied("the event has neither a source event id nor a source global position")
	case dedupeKafkaDelivery:
		if d.Kafka == nil {
			return unsatisfied("the delivery has no Kafka coordinates")
		}
		return fmt.Sprintf("%s:%d:%d", d.Kafka.Topic, d.Kafka.Partition, d.Kafka.Offset), nil
	case dedupeCustom:
		if p.fn == nil {
			return unsatisfied("no key function")
		}
		k, err := p.fn(d)
		if err != nil {
			return unsatisfied(err.Error())
		}
		if k == "" {
			return unsatisfied("the key function returned an empty key")
		}
		return k, nil
	}
	return unsatisfied("unknown policy")
}
