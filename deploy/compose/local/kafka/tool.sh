#!/usr/bin/env bash
# Kafka's command-line tools by the names the distribution's bin/ gives them.
set -euo pipefail
case "$(basename "$0")" in
  kafka-topics.sh) main=org.apache.kafka.tools.TopicCommand ;;
  kafka-broker-api-versions.sh) main=org.apache.kafka.tools.BrokerApiVersionsCommand ;;
  kafka-storage.sh) main=kafka.tools.StorageTool ;;
  kafka-consumer-groups.sh) main=org.apache.kafka.tools.consumer.group.ConsumerGroupCommand ;;
  *) echo "unknown tool $0" >&2; exit 2 ;;
esac
exec java -Xmx256m -Dlog4j2.configurationFile=/opt/kafka/config/log4j2.yaml -cp '/opt/kafka/libs/*' "$main" "$@"
