package publish

import "github.com/keiro-go/keiro/envelope"

// Rejection is an event that cannot be published: Kafka refused it for good, its topic is
// not a legal name or stayed unknown, it is larger than MaxRecordBytes, or its row does not
// decode into an event. The log engine hands it to DeadLetter and moves on.
type Rejection struct {
	// MessageID and Source identify the event.
	MessageID, Source string
	// Destination is the topic it was produced to.
	Destination string
	// Key is its Kafka key; nil when it has none.
	Key *string
	// Code is the rejection code, the Kafka error name in lower case ("message_too_large",
	// ...) or one of kafkaerr's own, as the claim engine's rejection_code.
	Code string
	// Err is the refusal.
	Err error
	// Event is the decoded event, whole: what a dead letter keeps.
	Event *envelope.Event
}

// maxDeadLetterWrites bounds the DeadLetter calls running at once: a burst of rejections
// takes a few database connections, not one per record.
const maxDeadLetterWrites = 4

// DeadLetter makes r durable through the configured sink (a 'rejected' row of keiro_outbox),
// at most maxDeadLetterWrites at a time, and returns nil once it is; without a sink it logs r.
// The sink is idempotent: a replayed transaction's second rejection writes nothing.
func (p *Publisher) DeadLetter(r Rejection) error {
	p.deadLetters <- struct{}{}
	defer func() { <-p.deadLetters }()
	if p.deadLetter != nil {
		return p.deadLetter(r)
	}
	p.log.Error("log mode: Kafka refused an event for good; the stream moves on",
		"message_id", r.MessageID, "source", r.Source, "destination", r.Destination, "code", r.Code, "err", r.Err)
	return nil
}
