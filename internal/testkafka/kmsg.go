package testkafka

import "github.com/twmb/franz-go/pkg/kmsg"

func kmsgCreateTopics(topic string, partitions int32) *kmsg.CreateTopicsRequest {
	req := kmsg.NewPtrCreateTopicsRequest()
	t := kmsg.NewCreateTopicsRequestTopic()
	t.Topic = topic
	t.NumPartitions = partitions
	t.ReplicationFactor = 1
	req.Topics = append(req.Topics, t)
	req.TimeoutMillis = 10000
	return req
}
