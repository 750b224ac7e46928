package schema

import (
	"context"

	"github.com/keiro-go/keiro/envelope"
)

// CheckBody exposes the bounded pre-decoding check to the benchmarks.
func CheckBody(s *Schema, body []byte) error { return checkBody(s.shape, body) }

// EncodeOverhead runs what Encode adds to goavro: the cached registry identity for topic, the
// frame header and the event's SchemaRef.
func (s *Serializer) EncodeOverhead(ctx context.Context, topic string, dst []byte) ([]byte, *envelope.SchemaRef, error) {
	r, err := s.registered(ctx, topic)
	if err != nil {
		return dst, nil, err
	}
	return append(dst, r.header[:]...), r.newRef(), nil
}
