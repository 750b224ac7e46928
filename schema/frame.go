package schema

import (
	"encoding/binary"
	"fmt"
)

// MagicByte is the first byte of a Confluent-framed payload.
const MagicByte byte = 0

// FrameHeaderLen is the length of the Confluent header: the magic byte and the 4-byte
// big-endian schema id.
const FrameHeaderLen = 5

// AppendFrameHeader appends the Confluent header for schemaID to dst: magic byte 0, then the
// id as a 4-byte big-endian integer. The Avro binary datum follows it.
func AppendFrameHeader(dst []byte, schemaID uint32) []byte {
	return binary.BigEndian.AppendUint32(append(dst, MagicByte), schemaID)
}

// DecodeFrame splits a Confluent-framed payload into its schema id and its Avro body. It
// checks the header only; the body is checked against the writer schema by
// [Deserializer.Decode]. Errors are *DecodeError matching ErrTruncatedFrame or
// ErrWrongMagicByte (and ErrMalformedPayload). The body aliases payload.
func DecodeFrame(payload []byte) (schemaID uint32, body []byte, err error) {
	if len(payload) < FrameHeaderLen {
		return 0, nil, &DecodeError{Kind: ErrTruncatedFrame, SchemaID: -1, Detail: fmt.Sprintf(
			"payload has %d bytes, a Confluent frame needs at least %d (magic byte + 4-byte schema id); "+
				"the producer did not use a Schema Registry serializer", len(payload), FrameHeaderLen)}
	}
	if payload[0] != MagicByte {
		return 0, nil, &DecodeError{Kind: ErrWrongMagicByte, SchemaID: -1, Detail: fmt.Sprintf(
			"first byte is 0x%02x, want 0x00; the payload is not Confluent-framed Avro "+
				"(check the producer's serializer and the content-type header)", payload[0])}
	}
	return binary.BigEndian.Uint32(payload[1:FrameHeaderLen]), payload[FrameHeaderLen:], nil
}
