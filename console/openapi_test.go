package console_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/console"
)

// openAPIRoutes are the operations of the document as "METHOD /path".
func openAPIRoutes(doc map[string]any) []string {
	var out []string
	for path, item := range doc["paths"].(map[string]any) {
		for method := range item.(map[string]any) {
			out = append(out, strings.ToUpper(method)+" "+path)
		}
	}
	sort.Strings(out)
	return out
}

// validate checks v against schema (the subset the document uses: $ref, anyOf, type,
// properties, required, items, additionalProperties) and returns the first mismatch.
func validate(doc map[string]any, schema map[string]any, v any, at string) error {
	if ref, ok := schema["$ref"].(string); ok {
		name := strings.TrimPrefix(ref, "#/components/schemas/")
		s, ok := doc["components"].(map[string]any)["schemas"].(map[string]any)[name].(map[string]any)
		if !ok {
			return fmt.Errorf("%s: unresolved %s", at, ref)
		}
		return validate(doc, s, v, at)
	}
	if alts, ok := schema["anyOf"].([]any); ok {
		var errs []string
		for _, s := range alts {
			err := validate(doc, s.(map[string]any), v, at)
			if err == nil {
				return nil
			}
			errs = append(errs, err.Error())
		}
		return fmt.Errorf("%s: matches none of anyOf: %s", at, strings.Join(errs, "; "))
	}
	typ, _ := schema["type"].(string)
	switch typ {
	case "":
		return nil
	case "null":
		if v != nil {
			return fmt.Errorf("%s: %v is not null", at, v)
		}
	case "string":
		if _, ok := v.(string); !ok {
			return fmt.Errorf("%s: %v is not a string", at, v)
		}
	case "boolean":
		if _, ok := v.(bool); !ok {
			return fmt.Errorf("%s: %v is not a boolean", at, v)
		}
	case "integer", "number":
		n, ok := v.(json.Number)
		if !ok {
			return fmt.Errorf("%s: %v is not a number", at, v)
		}
		if _, err := n.Int64(); typ == "integer" && err != nil {
			return fmt.Errorf("%s: %v is not an integer", at, v)
		}
	case "array":
		a, ok := v.([]any)
		if !ok {
			return fmt.Errorf("%s: %v is not an array", at, v)
		}
		for i, e := range a {
			if err := validate(doc, schema["items"].(map[string]any), e, fmt.Sprintf("%s[%d]", at, i)); err != nil {
				return err
			}
		}
	case "object":
		o, ok := v.(map[string]any)
		if !ok {
			return fmt.Errorf("%s: %v is not an object", at, v)
		}
		props, _ := schema["properties"].(map[string]any)
		req, _ := schema["required"].([]any)
		for _, r := range req {
			if _, ok := o[r.(string)]; !ok {
				return fmt.Errorf("%s: required %q missing", at, r)
			}
		}
		for k, e := range o {
			s, ok := props[k].(map[string]any)
			if !ok {
				if ap, ok := schema["additionalProperties"].(map[string]any); ok {
					s = ap
				} else if props != nil {
					return fmt.Errorf("%s: property %q is not in the schema", at, k)
				}
			}
			if s != nil {
				if err := validate(doc, s, e, at+"."+k); err != nil {
					return err
				}
			}
		}
	default:
		return fmt.Errorf("%s: unknown type %q", at, typ)
	}
	return nil
}

func decodeNumbers(t *testing.T, body string) any {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(body))
	dec.UseNumber()
	var v any
	require.NoError(t, dec.Decode(&v), body)
	return v
}

// answerSchema is the schema of op's answer with status code.
func answerSchema(t *testing.T, doc map[string]any, method, path string, code int) map[string]any {
	t.Helper()
	op, ok := doc["paths"].(map[string]any)[path].(map[string]any)[strings.ToLower(method)].(map[string]any)
	require.True(t, ok, "%s %s is not in the document", method, path)
	resp, ok := op["responses"].(map[string]any)[fmt.Sprint(code)].(map[string]any)
	require.True(t, ok, "%s %s does not document status %d", method, path, code)
	return resp["content"].(map[string]any)["application/json"].(map[string]any)["schema"].(map[string]any)
}

// TestOpenAPICoversEveryRoute: GET /api/v1/openapi.json describes exactly the routes the console
// registers under /api/v1, and the answers of a console with rows, failures and dead letters —
// successes and refusals — validate against the document's schema for their status.
func TestOpenAPICoversEveryRoute(t *testing.T) {
	t.Parallel()
	const topic, dlq = "orders.oa.v1", "orders.oa.v1.dlq"
	r := newRig(t, func(c *console.Config) { c.Inbox.DeadLetterTopics, c.Inbox.Topics = []string{dlq}, []string{topic} })
	a := r.get(t, "/api/v1/openapi.json")
	require.Equal(t, http.StatusOK, a.code, a.body)
	var doc map[string]any
	a.json(t, &doc)
	require.Equal(t, "3.1.0", doc["openapi"])

	// The same console's registered routes, path parameters named as OpenAPI names them.
	con, err := console.New(console.Config{Inbox: &console.InboxConfig{Pool: r.db.Pool, Schema: r.db.Schema, Consumer: consumerName,
		Kafka: r.kc.NewClient(t), DeadLetterTopics: []string{dlq}, Topics: []string{topic}}, Auth: console.AuthConfig{AllowUnauthenticated: true}})
	require.NoError(t, err)
	var registered []string
	for _, p := range con.APIPatterns() {
		registered = append(registered, strings.ReplaceAll(p, "...}", "}"))
	}
	sort.Strings(registered)
	require.Equal(t, registered, openAPIRoutes(doc), "every /api/v1 route is documented, and nothing else")

	// Data for every answer: dead and rejected rows, a poisoned message, a dead letter.
	ids := r.enqueue(t, event("o1", "payments.v1", ptr("k1"), `{"a":1}`), event("o2", "payments.v1", nil, `not json`))
	r.exec(t, fmt.Sprintf(`UPDATE %s.keiro_outbox SET status = 'dead', attempt_count = 2, last_error = 'boom 1' WHERE outbox_id = $1`, r.db.Schema), ids[0])
	r.exec(t, fmt.Sprintf(`UPDATE %s.keiro_outbox SET status = 'rejected', rejected_at = now(), rejection_code = 'message_too_large', last_error = 'big' WHERE outbox_id = $1`, r.db.Schema), ids[1])
	r.process(t, event("p-1", topic, ptr("k"), `{"poison":true}`), 0, 3)
	r.kc.CreateTopic(t, dlq, 1)
	dl := record(event("d-1", topic, ptr("k"), `{}`), dlq)
	dl.Headers = append(dl.Headers, kgo.RecordHeader{Key: "keiro-dlq-reason", Value: []byte("decode")},
		kgo.RecordHeader{Key: "keiro-dlq-topic", Value: []byte(topic)})
	require.NoError(t, r.kc.NewClient(t).ProduceSync(context.Background(), dl).FirstErr())

	type call struct {
		method, path, doc string // doc: the documented path
		body              any
		code              int
	}
	key := url.PathEscape("orders") + "/" + url.PathEscape("p-1")
	calls := []call{
		{"GET", "/api/v1/outbox/summary", "", nil, 200},
		{"GET", "/api/v1/outbox/rows?status=dead,rejected,failed", "/api/v1/outbox/rows", nil, 200},
		{"GET", "/api/v1/outbox/rows?status=gone", "/api/v1/outbox/rows", nil, 400},
		{"GET", "/api/v1/outbox/rows/" + ids[0], "/api/v1/outbox/rows/{id}", nil, 200},
		{"GET", "/api/v1/outbox/rows/nope", "/api/v1/outbox/rows/{id}", nil, 400},
		{"GET", "/api/v1/outbox/groups", "", nil, 200},
		{"GET", "/api/v1/inbox/summary", "", nil, 200},
		{"GET", "/api/v1/inbox/failed", "", nil, 200},
		{"GET", "/api/v1/inbox/failed/" + key, "/api/v1/inbox/failed/{source}/{key}", nil, 200},
		{"GET", "/api/v1/inbox/failed/orders/none", "/api/v1/inbox/failed/{source}/{key}", nil, 404},
		{"GET", "/api/v1/inbox/groups", "", nil, 200},
		{"GET", "/api/v1/inbox/dead-letters", "", nil, 200},
		{"GET", "/api/v1/inbox/dead-letters/" + dlq + "/0/0", "/api/v1/inbox/dead-letters/{topic}/{partition}/{offset}", nil, 200},
		{"GET", "/api/v1/consumer/lag", "", nil, 200},
		{"GET", "/api/v1/search?q=o1", "/api/v1/search", nil, 200},
		{"GET", "/api/v1/search", "/api/v1/search", nil, 400},
		{"GET", "/api/v1/subscriptions", "", nil, 200},
		{"GET", "/api/v1/subscriptions/dead-letters", "", nil, 200},
		{"GET", "/api/v1/sagas", "", nil, 200},
		{"GET", "/api/v1/sagas?limit=0x", "/api/v1/sagas", nil, 400},
		{"POST", "/api/v1/outbox/requeue", "", console.RequeueRequest{IDs: []string{ids[0]}}, 200},
		{"POST", "/api/v1/outbox/requeue", "", map[string]any{"ids": "x"}, 400},
		{"POST", "/api/v1/outbox/archive", "", console.OutboxArchiveRequest{IDs: []string{ids[1]}}, 200},
		{"POST", "/api/v1/outbox/groups/requeue", "", console.GroupRef{Class: "dead", Message: "none"}, 404},
		{"POST", "/api/v1/inbox/retry", "", console.RetryRequest{All: true}, 200},
		{"POST", "/api/v1/inbox/archive", "", console.InboxArchiveRequest{}, 400},
		{"POST", "/api/v1/inbox/groups/retry", "", console.GroupRef{}, 400},
		{"POST", "/api/v1/inbox/dead-letters/replay", "", console.ReplayRequest{Records: []console.RecordRef{{Topic: dlq, Partition: 0, Offset: 0}}}, 200},
		{"POST", "/api/v1/subscriptions/dead-letters/replay", "", console.SubscriptionReplayRequest{Subscription: "none", All: true}, 200},
		// What schemathesis found: text no stored value can hold is refused, not a 500; a
		// partition that does not exist is not found.
		{"GET", "/api/v1/outbox/rows?destination=%00", "/api/v1/outbox/rows", nil, 400},
		{"GET", "/api/v1/search?q=%FF", "/api/v1/search", nil, 400},
		{"GET", "/api/v1/inbox/failed/orders/a%00b", "/api/v1/inbox/failed/{source}/{key}", nil, 400},
		{"POST", "/api/v1/outbox/requeue", "", console.RequeueRequest{Source: "a\x00"}, 400},
		{"POST", "/api/v1/subscriptions/dead-letters/replay", "", console.SubscriptionReplayRequest{Subscription: "a\x00", All: true}, 400},
		{"GET", "/api/v1/inbox/dead-letters/" + dlq + "/2505/0", "/api/v1/inbox/dead-letters/{topic}/{partition}/{offset}", nil, 404},
	}
	seen := map[string]bool{"GET /api/v1/openapi.json": true}
	for _, c := range calls {
		var ans answer
		if c.method == "POST" {
			ans = r.postJSON(t, c.path, c.body)
		} else {
			ans = r.get(t, c.path)
		}
		require.Equal(t, c.code, ans.code, "%s %s: %s", c.method, c.path, ans.body)
		path := c.doc
		if path == "" {
			path = c.path
		}
		seen[c.method+" "+path] = true
		schema := answerSchema(t, doc, c.method, path, c.code)
		require.NoError(t, validate(doc, schema, decodeNumbers(t, ans.body), c.method+" "+c.path), ans.body)
	}
	for _, route := range openAPIRoutes(doc) {
		require.True(t, seen[route], "%s has no call in this test", route)
	}
}
