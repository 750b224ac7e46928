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
