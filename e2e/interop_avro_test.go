package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/envelope"
	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/schema"
)

const interopAvro = `{"type":"record","name":"Parcel","namespace":"keiro.e2e","fields":[
  {"name":"id","type":"string"},
  {"name":"qty","type":"int"},
  {"name":"price","type":"double"},
  {"name":"tags","type":{"type":"array","items":"string"}},
  {"name":"note","type":["null","string"],"default":null}]}`

// TestInteropConfluentAvro: confluent-kafka's Avro serializer (librdkafka's Python binding and
// its schema registry client) and ours share the real schema registry (Apicurio). Python
// registers the schema and writes Avro records that our deserializer decodes; our serializer
// finds the schema Python registered (its own layout of the text) and writes records that
// Python's deserializer decodes.
func TestInteropConfluentAvro(t *testing.T) {
	t.Parallel()
	eachKafka(t, testInteropConfluentAvro)
}

func testInteropConfluentAvro(t *testing.T, kc *testenv.Kafka) {
	out, err := exec.Command(debianPython, "-c", "import confluent_kafka.avro").CombinedOutput()
	require.NoError(t, err, "confluent-kafka's Avro serializer needs python3-confluent-kafka, python3-avro and python3-requests for %s (.ci/run installs them): %s", debianPython, out)

	ctx := context.Background()
	registry := testenv.NewSchemaRegistry(t)
	topic := kc.Topic(registry.Name("e2e.avro-interop.v1"))
	kc.CreateTopic(t, topic, 1)
	brokers := strings.Join(kc.Seeds, ",")
	schemaFile := filepath.Join(t.TempDir(), "parcel.avsc")
	require.NoError(t, os.WriteFile(schemaFile, []byte(interopAvro), 0o600))
	script := filepath.Join("testdata", "avro_interop.py")

	values := func(side string) map[string]string {
		return map[string]string{
			side + "-1": `{"id":"` + side + `-1","qty":3,"price":12.5,"tags":["a","b"],"note":"leave at door ✓"}`,
			side + "-2": `{"id":"` + side + `-2","qty":-7,"price":0,"tags":[],"note":null}`,
			side + "-3": `{"id":"` + side + `-3","qty":2147483647,"price":-1e-3,"tags":["ü"],"note":""}`,
		}
	}

	// Python writes; the registry learns the schema from it.
	pyValues := values("py")
	var stdin bytes.Buffer
	for key, v := range pyValues {
		line, err := json.Marshal(map[string]any{"key": key, "value": json.RawMessage(v)})
		require.NoError(t, err)
		stdin.Write(append(line, '\n'))
	}
	cmd := exec.Command(debianPython, script, "produce", brokers, topic, registry.URL, schemaFile)
	cmd.Stdin = &stdin
	pyOut, err := cmd.Output()
	require.NoError(t, err, "avro_interop.py produce: %s", exitStderr(err))
	pyID, err := strconv.Atoi(strings.TrimSpace(string(pyOut)))
	require.NoError(t, err, "avro_interop.py printed %q", pyOut)

	// Our deserializer reads Python's records.
	reg, err := schema.NewRegistry(schema.RegistryConfig{URL: registry.URL})
	require.NoError(t, err)
	t.Cleanup(reg.Close)
	de, err := schema.NewDeserializer(reg, schema.DeserializerConfig{JSON: schema.PlainJSON})
	require.NoError(t, err)
	recs := kc.Records(t, topic)
	require.Len(t, recs, len(pyValues))
	for _, r := range recs {
		id, _, err := schema.DecodeFrame(r.Value)
		require.NoError(t, err, "record %s", r.Key)
		require.Equal(t, pyID, int(id), "record %s carries the id Python registered", r.Key)
		js, err := de.DecodeJSON(ctx, r.Value)
		require.NoError(t, err, "record %s", r.Key)
		require.JSONEq(t, pyValues[string(r.Key)], string(js), "record %s", r.Key)
	}

	// Our serializer finds Python's schema (lookup only) and writes; Python reads.
	ser, err := schema.NewSerializer(reg, interopAvro, schema.SerializerConfig{JSON: schema.PlainJSON})
	require.NoError(t, err)
	goValues := values("go")
	var produce []*kgo.Record
	for key, v := range goValues {
		ev := envelope.Event{Destination: topic}
		require.NoError(t, ser.Encode(ctx, &ev, json.RawMessage(v)))
		require.Equal(t, int64(pyID), *ev.SchemaRef.SchemaID, "our serializer found the schema Python registered")
		produce = append(produce, &kgo.Record{Topic: topic, Key: []byte(key), Value: ev.Payload})
	}
	pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	require.NoError(t, kc.Client.ProduceSync(pctx, produce...).FirstErr())

	n := len(pyValues) + len(goValues)
	cout, err := exec.Command(debianPython, script, "consume", brokers, topic, registry.URL, strconv.Itoa(n)).Output()
	require.NoError(t, err, "avro_interop.py consume: %s", exitStderr(err))
	seen := map[string]bool{}
	for _, line := range bytes.Split(bytes.TrimSpace(cout), []byte("\n")) {
		var rec struct {
			Key   string
			Value json.RawMessage
		}
		require.NoError(t, json.Unmarshal(line, &rec), "python line %s", line)
		want, ok := goValues[rec.Key]
		if !ok {
			want, ok = pyValues[rec.Key]
		}
		require.True(t, ok, "python read an unknown record %s", line)
		require.JSONEq(t, want, string(rec.Value), "python's decoding of %s", rec.Key)
		seen[rec.Key] = true
	}
	require.Len(t, seen, n, fmt.Sprintf("python read %d distinct records of %d", len(seen), n))
}
