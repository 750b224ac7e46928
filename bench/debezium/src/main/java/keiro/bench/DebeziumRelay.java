package keiro.bench;

import io.debezium.embedded.Connect;
import io.debezium.engine.DebeziumEngine;
import io.debezium.engine.RecordChangeEvent;
import io.debezium.engine.format.ChangeEventFormat;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.header.internals.RecordHeaders;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.apache.kafka.connect.header.Header;
import org.apache.kafka.connect.source.SourceRecord;

/**
 * Debezium embedded as an outbox relay over keiro's keiro_outbox_log (insert-only rows): the
 * PostgreSQL connector (pgoutput) on a slot and publication the caller created, no snapshot,
 * the outbox event router mapped to keiro's columns, and a Kafka producer with acks=all and
 * idempotence. A batch's offsets are committed after the producer acknowledged all of its
 * records (at least once).
 *
 * <p>Arguments: host port user password dbname schema slot publication brokers variant, where
 * variant is "documented" (the engine's and producer's defaults) or "tuned" (4x the engine's
 * batch and queue, 10 ms poll). It prints "ready" once the connector's task streams, and on
 * EOF of stdin stops and prints "hwm KiB" (its peak RSS, VmHWM).
 */
public final class DebeziumRelay {
    private DebeziumRelay() {}

    public static void main(String[] args) throws Exception {
        if (args.length != 10) {
            System.err.println("usage: DebeziumRelay host port user password dbname schema slot publication brokers documented|tuned");
            System.exit(2);
        }
        String schema = args[5];
        boolean tuned = args[9].equals("tuned");

        Properties p = new Properties();
        p.setProperty("name", "keiro-bench-" + args[6]);
        p.setProperty("connector.class", "io.debezium.connector.postgresql.PostgresConnector");
        p.setProperty("offset.storage", "org.apache.kafka.connect.storage.MemoryOffsetBackingStore");
        p.setProperty("database.hostname", args[0]);
        p.setProperty("database.port", args[1]);
        p.setProperty("database.user", args[2]);
        p.setProperty("database.password", args[3]);
        p.setProperty("database.dbname", args[4]);
        p.setProperty("topic.prefix", "keiro-bench");
        p.setProperty("plugin.name", "pgoutput");
        p.setProperty("slot.name", args[6]);
        p.setProperty("publication.name", args[7]);
        p.setProperty("publication.autocreate.mode", "disabled");
        p.setProperty("snapshot.mode", "no_data");
        p.setProperty("table.include.list", schema + ".keiro_outbox_log");
        p.setProperty("binary.handling.mode", "bytes");
        // The outbox event router, mapped to keiro's columns: the topic is the row's
        // destination, the key its message_key, the value its payload_bytes, the id header
        // its message_id.
        p.setProperty("transforms", "outbox");
        p.setProperty("transforms.outbox.type", "io.debezium.transforms.outbox.EventRouter");
        p.setProperty("transforms.outbox.table.field.event.id", "message_id");
        p.setProperty("transforms.outbox.table.field.event.key", "message_key");
        p.setProperty("transforms.outbox.table.field.event.payload", "payload_bytes");
        p.setProperty("transforms.outbox.route.by.field", "destination");
        p.setProperty("transforms.outbox.route.topic.replacement", "${routedByValue}");
        p.setProperty("transforms.outbox.table.fields.additional.placement", "event_type:header:event_type");
        if (tuned) {
            p.setProperty("max.batch.size", "8192"); // default 2048
            p.setProperty("max.queue.size", "32768"); // default 8192
            p.setProperty("poll.interval.ms", "10"); // default 500
        }

        Properties pp = new Properties();
        pp.setProperty(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, args[8]);
        pp.setProperty(ProducerConfig.ACKS_CONFIG, "all");
        pp.setProperty(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
        KafkaProducer<byte[], byte[]> producer =
                new KafkaProducer<>(pp, new ByteArraySerializer(), new ByteArraySerializer());

        DebeziumEngine.ChangeConsumer<RecordChangeEvent<SourceRecord>> consumer = (records, committer) -> {
            List<Future<RecordMetadata>> acks = new ArrayList<>(records.size());
            for (RecordChangeEvent<SourceRecord> r : records) {
                SourceRecord sr = r.record();
                if (sr.value() == null) {
                    continue; // a tombstone: keiro's rows never delete
                }
                RecordHeaders hs = new RecordHeaders();
                for (Header h : sr.headers()) {
                    if (h.value() != null) {
                        hs.add(h.key(), h.value().toString().getBytes(StandardCharsets.UTF_8));
                    }
                }
                acks.add(producer.send(new ProducerRecord<>(sr.topic(), null, bytes(sr.key()), bytes(sr.value()), hs)));
            }
            try {
                for (Future<RecordMetadata> f : acks) {
                    f.get();
                }
            } catch (java.util.concurrent.ExecutionException e) {
                throw new RuntimeException("produce", e.getCause());
            }
            for (RecordChangeEvent<SourceRecord> r : records) {
                committer.markProcessed(r);
            }
            committer.markBatchFinished();
        };

        DebeziumEngine<RecordChangeEvent<SourceRecord>> engine = DebeziumEngine.create(ChangeEventFormat.of(Connect.class))
                .using(p)
                .using(new DebeziumEngine.ConnectorCallback() {
                    @Override
                    public void pollingStarted() {
                        System.out.println("ready");
                        System.out.flush();
                    }
                })
                .using((success, message, error) -> {
                    if (!success) {
                        System.err.println("debezium: " + message);
                        if (error != null) {
                            error.printStackTrace();
                        }
                    }
                })
                .notifying(consumer)
                .build();
        ExecutorService ex = Executors.newSingleThreadExecutor();
        ex.execute(engine);

        while (System.in.read() >= 0) {
            // the parent closes stdin to stop us
        }
        engine.close();
        ex.shutdown();
        ex.awaitTermination(60, TimeUnit.SECONDS);
        producer.close();
        System.out.println("hwm " + vmHWM());
        System.out.flush();
        System.exit(0);
    }

    private static byte[] bytes(Object o) {
        if (o == null) {
            return null;
        }
        if (o instanceof byte[] b) {
            return b;
        }
        if (o instanceof ByteBuffer bb) {
            byte[] b = new byte[bb.remaining()];
            bb.duplicate().get(b);
            return b;
        }
        return o.toString().getBytes(StandardCharsets.UTF_8);
    }

    private static long vmHWM() throws IOException {
        for (String l : Files.readAllLines(Path.of("/proc/self/status"))) {
            if (l.startsWith("VmHWM:")) {
                return Long.parseLong(l.substring(6).trim().replace(" kB", "").trim());
            }
        }
        return 0;
    }
}
