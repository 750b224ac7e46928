package inbox

import (
	"errors"
	"fmt"
	"strings"

	"github.com/keiro-go/keiro/envelope"
)

// ValidateDeadLetterTopic checks a dead-letter topic template ([ConsumerConfig.DeadLetterTopic])
// against the topics it serves: "{topic}" is its only placeholder, and the name it gives for
// each topic is a legal Kafka topic ([envelope.ValidateTopic]) that is not itself one of the
// topics. With topic patterns (regex true) the topics' names are not known: the template is
// checked with "{topic}" standing for a legal name. Topics that are not legal names themselves
// are skipped (they are reported on their own). Every problem is returned, joined.
//
// An invalid dead-letter topic is refused by every produce, so a consumer started with one would
// retry its first poisoned record forever, holding up the record's partition.
func ValidateDeadLetterTopic(template string, topics []string, regex bool) error {
	if template == "" {
		return errors.New("is empty")
	}
	if rest := strings.ReplaceAll(template, "{topic}", ""); strings.ContainsAny(rest, "{}") {
		return fmt.Errorf("%q has a placeholder other than {topic} (the only one replaced)", template)
	}
	if !strings.Contains(template, "{topic}") {
		if err := envelope.ValidateTopic(template); err != nil {
			return fmt.Errorf("topic %q %v", template, err)
		}
		if !regex {
			for _, t := range topics {
				if t == template {
					return fmt.Errorf("%q is also consumed; use a topic the consumer does not read", t)
				}
			}
		}
		return nil
	}
	if regex {
		if err := envelope.ValidateTopic(strings.ReplaceAll(template, "{topic}", "t")); err != nil {
			return fmt.Errorf("%q is not a legal Kafka topic for any topic: it %v", template, err)
		}
		return nil
	}
	var errs []error
	for _, t := range topics {
		if envelope.ValidateTopic(t) != nil {
			continue
		}
		dlq := strings.ReplaceAll(template, "{topic}", t)
		if err := envelope.ValidateTopic(dlq); err != nil {
			errs = append(errs, fmt.Errorf("gives %q for topic %q, which %v", dlq, t, err))
		}
		for _, other := range topics {
			if dlq == other {
				errs = append(errs, fmt.Errorf("gives %q for topic %q, which is also consumed", dlq, t))
			}
		}
	}
	return errors.Join(errs...)
}

// joined returns the errors joined in err, or err alone.
func joined(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

// Dead-letter header names added to the original headers of a dead-lettered record.
const (
	HeaderDLQReason    = "keiro-dlq-reason"
	HeaderDLQError     = "keiro-dlq-error"
	HeaderDLQAttempts  = "keiro-dlq-attempts"
	HeaderDLQTopic     = "keiro-dlq-topic"
	HeaderDLQPartition = "keiro-dlq-partition"
	HeaderDLQOffset    = "keiro-dlq-offset"
	HeaderDLQConsumer  = "keiro-dlq-consumer"
	HeaderDLQAt        = "keiro-dlq-at"
	// HeaderDLQValueOmitted is set on a dead letter Kafka could not take whole (too large):
	// the value is omitted and the header holds its size in bytes. The original stays at
	// keiro-dlq-topic, -partition and -offset (until the topic's retention removes it).
	HeaderDLQValueOmitted = "keiro-dlq-value-omitted"
	// HeaderDLQKeyOmitted and HeaderDLQHeadersOmitted are set on a dead letter too large for
	// Kafka even without its value: the key (its size in bytes) and the original headers
	// (their count) are omitted too.
	HeaderDLQKeyOmitted     = "keiro-dlq-key-omitted"
	HeaderDLQHeadersOmitted = "keiro-dlq-headers-omitted"
)

// Values of the keiro-dlq-reason header.
const (
	// ReasonDecode: the record is not a valid keiro envelope (the error names the header).
	ReasonDecode = "decode"
	// ReasonSchema: the SchemaDecoder rejected the payload permanently.
	ReasonSchema = "schema"
	// ReasonDedupe: the dedupe policy cannot compute a key for the record.
	ReasonDedupe = "dedupe"
	// ReasonPoisoned: the handler failed MaxAttempts times.
	ReasonPoisoned = "poisoned"
	// ReasonPermanent: the handler returned a Permanent error.
	ReasonPermanent = "permanent"
	// ReasonUnstorable: PostgreSQL refuses the record's content in the inbox row (invalid
	// UTF-8 or a NUL byte in a text header, \u0000 in the attributes, a dedupe key too long
	// for the index): retrying could never store it.
	ReasonUnstorable = "unstorable"
)

// deadLetterTopic is the dead-letter topic of records read from topic.
func (c *Consumer) deadLetterTopic(topic string) string {
	return strings.ReplaceAll(c.cfg.DeadLetterTopic, "{topic}", topic)
}
