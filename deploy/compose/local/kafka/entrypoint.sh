#!/usr/bin/env bash
# Writes server.properties from the KAFKA_* environment as the apache/kafka image does
# (KAFKA_FOO_BAR → foo.bar, ___ → -, __ → _), formats the storage once, and runs the broker.
set -euo pipefail
props=/opt/kafka/config/server.properties
: > "$props"
while IFS='=' read -r name value; do
  case "$name" in
    KAFKA_HEAP_OPTS|KAFKA_OPTS|KAFKA_JVM_PERFORMANCE_OPTS|KAFKA_LOG4J_OPTS|KAFKA_BOOTSTRAP|KAFKA_CLUSTER_ID) continue ;;
    KAFKA_*) ;;
    *) continue ;;
  esac
  key=${name#KAFKA_}
  key=$(printf '%s' "$key" | sed -e 's/___/-/g' -e 's/__/@/g' -e 's/_/./g' -e 's/@/_/g' | tr '[:upper:]' '[:lower:]')
  printf '%s=%s\n' "$key" "$value" >> "$props"
done < <(env)
grep -q '^log.dirs=' "$props" || echo 'log.dirs=/var/lib/kafka/data' >> "$props"
if [ ! -f /var/lib/kafka/data/meta.properties ]; then
  cluster=${KAFKA_CLUSTER_ID:-5L6g3nShT-eMCtK--X86sw}
  java -Xmx256m -Dlog4j2.configurationFile=/opt/kafka/config/log4j2.yaml -cp '/opt/kafka/libs/*' \
    kafka.tools.StorageTool format --ignore-formatted -t "$cluster" -c "$props" >/dev/null
fi
exec java ${KAFKA_HEAP_OPTS:--Xmx512m -Xms256m} -XX:+UseG1GC -Djava.awt.headless=true \
  -Dlog4j2.configurationFile=/opt/kafka/config/log4j2.yaml -cp '/opt/kafka/libs/*' kafka.Kafka "$props"
