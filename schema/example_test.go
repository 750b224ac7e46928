package schema_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/schema"
	"github.com/twmb/franz-go/pkg/sr"
	"github.com/twmb/franz-go/pkg/sr/srfake"
)

func Example() {
	const orderPlaced = `{"type":"record","name":"OrderPlaced","namespace":"com.acme","fields":[
		{"name":"order_id","type":"string"},
		{"name":"amount_cents","type":"long"},
		{"name":"coupon","type":["null","string"],"default":null}]}`

	// A registry with the schema registered (in production: `relay schema register`).
	fake := srfake.NewRegistry()
	srv := httptest.NewServer(fake.Handler())
	defer srv.Close()
	_, _, _ = fake.RegisterSchema("billing.orders.v1-value", sr.Schema{Schema: orderPlaced})

	reg, err := schema.NewRegistry(schema.RegistryConfig{URL: srv.URL, Name: "main"})
	if err != nil {
		panic(err)
	}
	defer reg.Close()
	ctx := context.Background()

	// Producer side: fill the event's payload before enqueuing it into the outbox.
	ser, _ := schema.NewSerializer(reg, orderPlaced, schema.SerializerConfig{JSON: schema.PlainJSON})
	ev := envelope.Event{Destination: "billing.orders.v1", EventType: "OrderPlaced"}
	if err := ser.Encode(ctx, &ev, json.RawMessage(`{"order_id":"o-1","amount_cents":1999,"coupon":"SPRING"}`)); err != nil {
		panic(err)
	}
	fmt.Println(ev.ContentType, *ev.SchemaRef.Subject, *ev.SchemaRef.Version, *ev.SchemaRef.SchemaID)
	fmt.Printf("frame % x\n", ev.Payload[:schema.FrameHeaderLen])

	// Consumer side: decode with the writer schema fetched by id.
	de, _ := schema.NewDeserializer(reg, schema.DeserializerConfig{})
	v, _, err := de.Decode(ctx, ev.Payload)
	if err != nil {
		panic(err)
	}
	rec := v.(map[string]any)
	fmt.Println(rec["order_id"], rec["amount_cents"], rec["coupon"])
	// Output:
	// application/avro billing.orders.v1-value 1 1
	// frame 00 00 00 00 01
	// o-1 1999 map[string:SPRING]
}
