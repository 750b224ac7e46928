package main

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keiro-go/keiro/keirotest/testenv"
)

// preflightEnv is a working sql-mode configuration for db and kc, before the case's changes.
func preflightEnv(db *testenv.DB, kc *testenv.Kafka, topic string) []string {
	return []string{
		"KEIRO_CONSUMER_DATABASE_URL=" + testenv.DatabaseURL(),
		"KEIRO_CONSUMER_SCHEMA=" + db.Schema,
		"KEIRO_CONSUMER_BROKERS=" + strings.Join(kc.Seeds, ","),
		"KEIRO_CONSUMER_GROUP=preflight",
		"KEIRO_CONSUMER_TOPICS=" + topic,
		"KEIRO_CONSUMER_HANDLER=sql",
		"KEIRO_CONSUMER_SQL_FUNCTION=" + db.Schema + ".apply",
		"KEIRO_CONSUMER_HTTP_ADDR=",
	}
}

// Configurations that cannot work are refused at start with exit 2, before a record is read
// (and so before any offset is committed or message dead-lettered).
func TestStartupRefusesWhatCannotWork(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	_, err := db.Pool.Exec(context.Background(), fmt.Sprintf(
		`CREATE FUNCTION %[1]s.apply(doc jsonb) RETURNS void LANGUAGE sql AS 'SELECT 1';
		 CREATE FUNCTION %[1]s.apply_text(doc text) RETURNS void LANGUAGE sql AS 'SELECT 1'`, db.Schema))
	require.NoError(t, err)
	kc := testenv.NewKafka(t)
	const topic = "preflight.orders"
	kc.CreateTopic(t, topic, 1)

	for _, tc := range []struct {
		name string
		env  []string
		args []string
		want []string
	}{
		{"misspelled function", []string{"KEIRO_CONSUMER_SQL_FUNCTION=" + db.Schema + ".aply"}, nil,
			[]string{"--sql-function: no function " + db.Schema + ".aply(jsonb) in the database", "CREATE FUNCTION"}},
		{"wrong signature", []string{"KEIRO_CONSUMER_SQL_FUNCTION=" + db.Schema + ".apply_text"}, nil,
			[]string{"no function " + db.Schema + ".apply_text(jsonb)", "found " + db.Schema + ".apply_text(text)"}},
		{"topic with a space", nil, []string{"--topics", "a b"},
			[]string{`--topics: topic "a b" is not a legal Kafka topic`}},
		{"bad dead-letter template", nil, []string{"--dlq-topic", "{topic}!!"},
			[]string{`--dlq-topic: gives "preflight.orders!!" for topic "preflight.orders", which is not a legal Kafka topic`}},
		{"unknown placeholder", nil, []string{"--dlq-topic", "{topc}.dlq"},
			[]string{"--dlq-topic: \"{topc}.dlq\" has a placeholder other than {topic}"}},
		{"missing topics required", nil, []string{"--require-topics", "--topics", topic + ",preflight.nope"},
			[]string{"--require-topics: these topics do not exist:", "preflight.nope (consumed)",
				"preflight.orders.dlq (dead-letter topic of preflight.orders)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := append(preflightEnv(db, kc, topic), tc.env...)
			r := runBinary(t, 60*time.Second, env, tc.args...)
			require.Equal(t, 2, r.code, "stderr:\n%s", r.stderr)
			for _, w := range tc.want {
				require.Contains(t, r.stderr, w)
			}
			require.NotContains(t, r.stderr, "msg=consuming", "refused before consuming")
		})
	}
}

// Without --require-topics a missing topic is a warning and the consumer starts.
func TestMissingTopicsWarnWithoutRequireTopics(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	_, err := db.Pool.Exec(context.Background(), fmt.Sprintf(
		`CREATE FUNCTION %s.apply(doc jsonb) RETURNS void LANGUAGE sql AS 'SELECT 1'`, db.Schema))
	require.NoError(t, err)
	kc := testenv.NewKafka(t)
	const topic = "preflight.present"
	kc.CreateTopic(t, topic, 1)
	p := startBinary(t, preflightEnv(db, kc, topic))
	m := p.waitLog(regexp.MustCompile(`msg="topics do not exist \(yet\).*topics="\[(.*)\]"`), 60*time.Second)
	require.Equal(t, "preflight.present.dlq (dead-letter topic of preflight.present)", m[1])
	p.waitLog(regexp.MustCompile(`msg=consuming`), 60*time.Second)
	require.Equal(t, 0, p.stop(30*time.Second), p.log())
}
