package console

import (
	"encoding"
	"encoding/json"
	"net/http"
	"reflect"
	"strings"
	"time"
)

// The admin API's OpenAPI 3.1 document (GET /api/v1/openapi.json). Each operation is described
// in apiOperations; the schemas of its bodies and answers are derived from the Go types the
// handlers encode and decode (their JSON field names, omitempty, pointers and slices), so that
// they change with the types. TestOpenAPICoversEveryRoute checks that the operations are
// exactly the routes the console registers, and that the answers validate against them.

// apiParam is one query or path parameter of an operation.
type apiParam struct {
	name, in, typ, doc string
	required           bool
}

// apiOperation documents one route of /api/v1.
type apiOperation struct {
	method, path, summary string
	params                []apiParam
	// body is a value of the request body's type (nil: no body).
	body any
	// answer is a value of the 200 answer's type.
	answer any
	// errors are the documented error statuses besides the ones every request may get.
	errors []int
}

// Shared parameters.
var (
	pLimit  = apiParam{name: "limit", in: "query", typ: "integer", doc: "rows per page, 1 to 200 (default 50)"}
	pCursor = apiParam{name: "cursor", in: "query", typ: "string", doc: "next_cursor of the previous page"}
	pArch   = apiParam{name: "archived", in: "query", typ: "boolean", doc: "true lists the archived rows instead of the working list"}
)

// openAPIAny is the answer of GET /api/v1/openapi.json: a JSON object.
type openAPIAny map[string]any

var apiOperations = []apiOperation{
	{method: "GET", path: "/api/v1/openapi.json", summary: "This document.", answer: openAPIAny{}},
	{method: "GET", path: "/api/v1/outbox/summary", summary: "Outbox counts per destination and status, backlog, rates of the last hour, relays connected.", answer: OutboxSummary{}},
	{method: "GET", path: "/api/v1/outbox/rows", summary: "A page of dead, rejected or retrying outbox rows, newest first.",
		params: []apiParam{{name: "status", in: "query", typ: "string", doc: "comma-separated: dead, rejected, failed (default dead,rejected)"},
			{name: "destination", in: "query", typ: "string"}, {name: "source", in: "query", typ: "string"}, pArch, pLimit, pCursor},
		answer: OutboxPage{}, errors: []int{400}},
	{method: "GET", path: "/api/v1/outbox/rows/{id}", summary: "One outbox row with its headers and payload.",
		params: []apiParam{{name: "id", in: "path", typ: "string", doc: "outbox id (UUID)", required: true}}, answer: OutboxRow{}, errors: []int{400, 404}},
	{method: "POST", path: "/api/v1/outbox/requeue", summary: "Requeue dead and rejected rows: by id, by source/destination, or all.",
		body: RequeueRequest{}, answer: RequeueAnswer{}, errors: []int{400, 403, 413}},
	{method: "GET", path: "/api/v1/outbox/groups", summary: "Dead and rejected rows grouped by error class and normalised message.", answer: FailureGroups{}},
	{method: "POST", path: "/api/v1/outbox/groups/requeue", summary: "Requeue the newest 1000 rows of a failure group.",
		body: GroupRef{}, answer: GroupRequeueAnswer{}, errors: []int{400, 403, 404, 413}},
	{method: "POST", path: "/api/v1/outbox/archive", summary: "Archive dead and rejected rows: by id, or a failure group.",
		body: OutboxArchiveRequest{}, answer: ArchiveAnswer{}, errors: []int{400, 403, 404, 413}},
	{method: "GET", path: "/api/v1/inbox/summary", summary: "Inbox rows per consumer name, and this consumer's last hour.", answer: InboxSummary{}},
	{method: "GET", path: "/api/v1/inbox/failed", summary: "A page of this consumer's failed messages, oldest failure first.",
		params: []apiParam{{name: "source", in: "query", typ: "string"}, pArch, pLimit, pCursor}, answer: InboxPage{}, errors: []int{400}},
	{method: "GET", path: "/api/v1/inbox/failed/{source}/{key}", summary: "One inbox row.",
		params: []apiParam{{name: "source", in: "path", typ: "string", required: true},
			{name: "key", in: "path", typ: "string", doc: "dedupe key, path-escaped", required: true}},
		answer: InboxEntry{}, errors: []int{400, 404}},
	{method: "POST", path: "/api/v1/inbox/retry", summary: "Re-run failed messages through the consumer's handler: by key, or all.",
		body: RetryRequest{}, answer: RetryAnswer{}, errors: []int{400, 403, 413, 501}},
	{method: "GET", path: "/api/v1/inbox/groups", summary: "This consumer's failed messages grouped by error class and normalised message.", answer: FailureGroups{}},
	{method: "POST", path: "/api/v1/inbox/groups/retry", summary: "Re-run the oldest 1000 messages of a failure group.",
		body: GroupRef{}, answer: RetryAnswer{}, errors: []int{400, 403, 404, 413, 501}},
	{method: "POST", path: "/api/v1/inbox/archive", summary: "Archive failed messages: by key, or a failure group.",
		body: InboxArchiveRequest{}, answer: ArchiveAnswer{}, errors: []int{400, 403, 404, 413}},
	{method: "GET", path: "/api/v1/inbox/dead-letters", summary: "The records of the consumer's dead-letter topics, newest first.",
		params: []apiParam{{name: "topic", in: "query", typ: "string", doc: "one of the consumer's dead-letter topics"}, pLimit, pCursor},
		answer: DeadLetterPage{}, errors: []int{400, 404}},
	{method: "GET", path: "/api/v1/inbox/dead-letters/{topic}/{partition}/{offset}", summary: "One dead-letter record with its payload.",
		params: []apiParam{{name: "topic", in: "path", typ: "string", required: true}, {name: "partition", in: "path", typ: "integer", required: true},
			{name: "offset", in: "path", typ: "integer", required: true}},
		answer: DeadLetterRecord{}, errors: []int{400, 404}},
	{method: "POST", path: "/api/v1/inbox/dead-letters/replay", summary: "Write dead-letter records back to their source topic.",
		body: ReplayRequest{}, answer: ReplayAnswer{}, errors: []int{400, 403, 404, 413}},
	{method: "GET", path: "/api/v1/consumer/lag", summary: "The group's lag per partition, with this member's progress on the partitions it owns.",
		answer: ConsumerLag{}, errors: []int{501, 502}},
	{method: "GET", path: "/api/v1/search", summary: "Find outbox rows and inbox messages by id, key, event type or source.",
		params: []apiParam{{name: "q", in: "query", typ: "string", required: true}, pLimit}, answer: SearchAnswer{}, errors: []int{400}},
	{method: "GET", path: "/api/v1/subscriptions", summary: "The event store's head and each subscription's checkpoint.", answer: Subscriptions{}},
	{method: "GET", path: "/api/v1/subscriptions/dead-letters", summary: "The subscriptions' dead letters, oldest first.",
		params: []apiParam{{name: "subscription", in: "query", typ: "string"},
			{name: "status", in: "query", typ: "string", doc: "dead, replay or replayed"}, pLimit, pCursor},
		answer: SubscriptionDeadLetters{}, errors: []int{400}},
	{method: "POST", path: "/api/v1/subscriptions/dead-letters/replay", summary: "Ask the running subscription to deliver dead letters again.",
		body: SubscriptionReplayRequest{}, answer: SubscriptionReplayAnswer{}, errors: []int{400, 403, 413}},
	{method: "GET", path: "/api/v1/sagas", summary: "The commands routers and process managers dead-lettered, and the durable timers due and firing.",
		params: []apiParam{{name: "dispatcher", in: "query", typ: "string", doc: "a router's or process manager's name"}, pLimit},
		answer: Sagas{}, errors: []int{400}},
}

// openAPIDocument builds the document.
func openAPIDocument() map[string]any {
	sg := &schemaGen{components: map[string]any{}}
	sg.components["Error"] = map[string]any{
		"type": "object", "required": []string{"error"},
		"properties":  map[string]any{"error": map[string]any{"type": "string"}},
		"description": "Every error: what went wrong and what to do.",
	}
	paths := map[string]any{}
	for _, op := range apiOperations {
		item, _ := paths[op.path].(map[string]any)
		if item == nil {
			item = map[string]any{}
			paths[op.path] = item
		}
		o := map[string]any{"summary": op.summary, "operationId": operationID(op)}
		var params []any
		for _, p := range op.params {
			pm := map[string]any{"name": p.name, "in": p.in, "required": p.required || p.in == "path", "schema": map[string]any{"type": p.typ}}
			if p.doc != "" {
				pm["description"] = p.doc
			}
			params = append(params, pm)
		}
		if op.method == http.MethodPost {
			params = append(params, map[string]any{"name": csrfHeader, "in": "header", "required": false, "schema": map[string]any{"type": "string"},
				"description": "the X-CSRF-Token header of any GET answer; not needed with a bearer token"})
			o["requestBody"] = map[string]any{"required": true, "content": map[string]any{
				"application/json": map[string]any{"schema": sg.schema(reflect.TypeOf(op.body))}}}
		}
		if len(params) > 0 {
			o["parameters"] = params
		}
		errRef := map[string]any{"description": "an error", "content": map[string]any{
			"application/json": map[string]any{"schema": map[string]any{"$ref": "#/components/schemas/Error"}}}}
		responses := map[string]any{"200": map[string]any{"description": "OK", "content": map[string]any{
			"application/json": map[string]any{"schema": sg.schema(reflect.TypeOf(op.answer))}}}}
		for _, code := range append([]int{401, 403, 404, 421, 500}, op.errors...) {
			responses[itoa(code)] = errRef
		}
		o["responses"] = responses
		item[strings.ToLower(op.method)] = o
	}
	return map[string]any{
		"openapi": "3.1.0",
		"info": map[string]any{"title": "keiro admin API", "version": "1",
			"description": "The relay's and the consumer's admin API (docs/console.md). Every answer is JSON; every error is {\"error\": \"…\"}."},
		"paths": paths,
		"components": map[string]any{
			"schemas": sg.components,
			"securitySchemes": map[string]any{
				"bearer": map[string]any{"type": "http", "scheme": "bearer"},
				"basic":  map[string]any{"type": "http", "scheme": "basic", "description": "any user name, the token as password"},
			},
		},
		// No credentials on loopback without a token; the token otherwise.
		"security": []any{map[string]any{}, map[string]any{"bearer": []string{}}, map[string]any{"basic": []string{}}},
	}
}

func itoa(n int) string {
	b, _ := json.Marshal(n)
	return string(b)
}

// operationID is a stable name for op: its method and path in camel case.
func operationID(op apiOperation) string {
	var b strings.Builder
	b.WriteString(strings.ToLower(op.method))
	for _, part := range strings.FieldsFunc(strings.TrimPrefix(op.path, "/api/v1/"), func(r rune) bool {
		return r == '/' || r == '-' || r == '.' || r == '{' || r == '}'
	}) {
		b.WriteString(strings.ToUpper(part[:1]) + part[1:])
	}
	return b.String()
}

// schemaGen derives JSON schemas from Go types, naming each struct type once in components.
type schemaGen struct {
	components map[string]any
}

var (
	timeType      = reflect.TypeOf(time.Time{})
	rawType       = reflect.TypeOf(json.RawMessage{})
	textMarshaler = reflect.TypeOf((*encoding.TextMarshaler)(nil)).Elem()
	jsonMarshaler = reflect.TypeOf((*json.Marshaler)(nil)).Elem()
)

// schema is t's schema as encoding/json writes a value of it.
func (g *schemaGen) schema(t reflect.Type) map[string]any {
	switch {
	case t == timeType:
		return map[string]any{"type": "string", "format": "date-time"}
	case t == rawType:
		return map[string]any{}
	case t.Implements(jsonMarshaler):
		return map[string]any{}
	case t.Implements(textMarshaler):
		return map[string]any{"type": "string"}
	}
	switch t.Kind() {
	case reflect.Pointer:
		return nullable(g.schema(t.Elem()))
	case reflect.String:
		return map[string]any{"type": "string"}
	case reflect.Bool:
		return map[string]any{"type": "boolean"}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return map[string]any{"type": "integer"}
	case reflect.Float32, reflect.Float64:
		return map[string]any{"type": "number"}
	case reflect.Slice, reflect.Array:
		if t.Elem().Kind() == reflect.Uint8 {
			return map[string]any{"type": "string", "contentEncoding": "base64"}
		}
		s := map[string]any{"type": "array", "items": g.schema(t.Elem())}
		if t.Kind() == reflect.Slice {
			return nullable(s) // a nil slice encodes as null
		}
		return s
	case reflect.Map:
		return nullable(map[string]any{"type": "object", "additionalProperties": g.schema(t.Elem())})
	case reflect.Interface:
		return map[string]any{}
	case reflect.Struct:
		name := t.Name()
		if name == "" {
			return g.object(t)
		}
		if _, ok := g.components[name]; !ok {
			g.components[name] = map[string]any{} // a placeholder for recursive types
			g.components[name] = g.object(t)
		}
		return map[string]any{"$ref": "#/components/schemas/" + name}
	}
	return map[string]any{}
}

// object is a struct's schema: its JSON fields, embedded structs' fields flattened, the fields
// without omitempty required.
func (g *schemaGen) object(t reflect.Type) map[string]any {
	props := map[string]any{}
	required := []string{}
	g.fields(t, props, &required)
	return map[string]any{"type": "object", "properties": props, "required": required}
}

func (g *schemaGen) fields(t reflect.Type, props map[string]any, required *[]string) {
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if tag == "-" || (!f.IsExported() && !f.Anonymous) {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		if f.Anonymous && name == "" && f.Type.Kind() == reflect.Struct {
			g.fields(f.Type, props, required)
			continue
		}
		if name == "" {
			name = f.Name
		}
		props[name] = g.schema(f.Type)
		if !strings.Contains(opts, "omitempty") {
			*required = append(*required, name)
		}
	}
}

// nullable allows null besides s.
func nullable(s map[string]any) map[string]any {
	return map[string]any{"anyOf": []any{s, map[string]any{"type": "null"}}}
}

func (c *Console) apiOpenAPI(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, c.openapi)
}
