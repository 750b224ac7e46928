#!/usr/bin/env bash
# Creates the demo topics on the compose Kafka; idempotent. TOPICS lists name:partitions.
set -euo pipefail
bootstrap=${KAFKA_BOOTSTRAP:-kafka:9092}
for spec in ${TOPICS:?set TOPICS to "name:partitions ..."}; do
  name=${spec%%:*}
  partitions=${spec##*:}
  /opt/kafka/bin/kafka-topics.sh --bootstrap-server "$bootstrap" --create --if-not-exists \
    --topic "$name" --partitions "$partitions" --replication-factor 1
done
/opt/kafka/bin/kafka-topics.sh --bootstrap-server "$bootstrap" --list
