package schema

import (
	"fmt"
	"strings"
)

// SubjectStrategy derives the registry subject a schema is registered under, as Confluent's
// serializers do. The zero value is [TopicNameStrategy].
type SubjectStrategy int

const (
	// TopicNameStrategy names the subject after the topic: "<topic>-value" or "<topic>-key".
	// One schema (and its evolutions) per topic. Confluent's default.
	TopicNameStrategy SubjectStrategy = iota
	// RecordNameStrategy names the subject after the record's full name
	// ("com.acme.OrderPlaced"), for the key and the value alike, whatever the topic: several
	// event types may share a topic, and one type may appear on several topics.
	RecordNameStrategy
	// TopicRecordNameStrategy names the subject "<topic>-<record full name>": several event
	// types per topic, each evolving separately per topic.
	TopicRecordNameStrategy
)

// String returns the strategy's Confluent name, for example "TopicNameStrategy".
func (s SubjectStrategy) String() string {
	switch s {
	case TopicNameStrategy:
		return "TopicNameStrategy"
	case RecordNameStrategy:
		return "RecordNameStrategy"
	case TopicRecordNameStrategy:
		return "TopicRecordNameStrategy"
	}
	return fmt.Sprintf("SubjectStrategy(%d)", int(s))
}

// ParseSubjectStrategy parses a strategy name as written in configuration: "topic",
// "record", "topic-record", or the Confluent class names ("TopicNameStrategy", ...), case
// insensitively.
func ParseSubjectStrategy(s string) (SubjectStrategy, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "topic", "topicname", "topicnamestrategy":
		return TopicNameStrategy, nil
	case "record", "recordname", "recordnamestrategy":
		return RecordNameStrategy, nil
	case "topic-record", "topicrecord", "topicrecordname", "topicrecordnamestrategy":
		return TopicRecordNameStrategy, nil
	}
	return 0, fmt.Errorf("unknown subject strategy %q; use topic, record or topic-record", s)
}

// Subject returns the subject for a schema whose full name is recordName (empty for an
// unnamed schema such as "string") written to topic, as a key if isKey, else as a value.
func (s SubjectStrategy) Subject(topic, recordName string, isKey bool) (string, error) {
	suffix := "-value"
	if isKey {
		suffix = "-key"
	}
	switch s {
	case TopicNameStrategy:
		if topic == "" {
			return "", fmt.Errorf("subject for %s: topic is empty", s)
		}
		return topic + suffix, nil
	case RecordNameStrategy:
		if recordName == "" {
			return "", fmt.Errorf("subject for %s: the schema has no name; use a named record or TopicNameStrategy", s)
		}
		return recordName, nil
	case TopicRecordNameStrategy:
		if topic == "" {
			return "", fmt.Errorf("subject for %s: topic is empty", s)
		}
		if recordName == "" {
			return "", fmt.Errorf("subject for %s: the schema has no name; use a named record or TopicNameStrategy", s)
		}
		return topic + "-" + recordName, nil
	}
	return "", fmt.Errorf("subject: unknown strategy %s", s)
}
