package envelope

import (
	"crypto/rand"
	"database/sql/driver"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"
)

// UUID is an RFC 9562 UUID. Its text form is lowercase and hyphenated.
type UUID [16]byte

// ErrInvalidUUID reports text that is not a hyphenated UUID.
var ErrInvalidUUID = errors.New("invalid UUID")

// ParseUUID parses the hyphenated form (8-4-4-4-12 hex digits, either case).
func ParseUUID(s string) (UUID, error) {
	var u UUID
	if len(s) != 36 || s[8] != '-' || s[13] != '-' || s[18] != '-' || s[23] != '-' {
		return u, fmt.Errorf("%w: %q", ErrInvalidUUID, s)
	}
	j := 0
	for i := 0; i < 36; {
		if i == 8 || i == 13 || i == 18 || i == 23 {
			i++
			continue
		}
		if _, err := hex.Decode(u[j:j+1], []byte(s[i:i+2])); err != nil {
			return UUID{}, fmt.Errorf("%w: %q", ErrInvalidUUID, s)
		}
		i += 2
		j++
	}
	return u, nil
}

// String returns the lowercase hyphenated form.
func (u UUID) String() string {
	var b [36]byte
	return string(u.appendText(b[:0]))
}

// appendText appends the lowercase hyphenated form to dst.
func (u UUID) appendText(dst []byte) []byte {
	var b [36]byte
	hex.Encode(b[0:8], u[0:4])
	b[8] = '-'
	hex.Encode(b[9:13], u[4:6])
	b[13] = '-'
	hex.Encode(b[14:18], u[6:8])
	b[18] = '-'
	hex.Encode(b[19:23], u[8:10])
	b[23] = '-'
	hex.Encode(b[24:], u[10:])
	return append(dst, b[:]...)
}

// MarshalText implements encoding.TextMarshaler: the lowercase hyphenated form, so a UUID is a
// string in JSON, in slog's JSON and text output, and in any other text encoding.
func (u UUID) MarshalText() ([]byte, error) { return u.appendText(nil), nil }

// AppendText implements encoding.TextAppender (the form of MarshalText).
func (u UUID) AppendText(b []byte) ([]byte, error) { return u.appendText(b), nil }

// UnmarshalText implements encoding.TextUnmarshaler: the hyphenated form, either case.
func (u *UUID) UnmarshalText(b []byte) error {
	v, err := ParseUUID(string(b))
	if err != nil {
		return err
	}
	*u = v
	return nil
}

// Value implements database/sql/driver.Valuer: the hyphenated text form, which PostgreSQL
// reads into a uuid column or parameter.
func (u UUID) Value() (driver.Value, error) { return u.String(), nil }

// Scan implements database/sql.Scanner. It accepts the text form (string or []byte, as a
// driver hands over a uuid column) and the 16 raw bytes. NULL is an error: scan a nullable
// column into a *UUID.
func (u *UUID) Scan(src any) error {
	switch v := src.(type) {
	case string:
		return u.UnmarshalText([]byte(v))
	case []byte:
		if len(v) == 16 {
			copy(u[:], v)
			return nil
		}
		return u.UnmarshalText(v)
	case nil:
		return fmt.Errorf("%w: cannot scan NULL into envelope.UUID (scan a nullable column into *envelope.UUID)", ErrInvalidUUID)
	}
	return fmt.Errorf("%w: cannot scan %T into envelope.UUID", ErrInvalidUUID, src)
}

// IsZero reports whether u is the nil UUID.
func (u UUID) IsZero() bool { return u == UUID{} }

var v7 struct {
	sync.Mutex
	lastMS  int64
	counter uint16 // 12-bit sequence in rand_a
}

// NewUUIDv7 returns a time-ordered UUIDv7. Ids minted by one process are strictly increasing
// (a 12-bit counter orders ids within the same millisecond), so ids minted in one transaction
// sort in insertion order.
func NewUUIDv7() UUID {
	var u UUID
	if _, err := rand.Read(u[:]); err != nil {
		panic(fmt.Sprintf("envelope: crypto/rand failed: %v", err))
	}
	v7.Lock()
	ms := time.Now().UnixMilli()
	if ms > v7.lastMS {
		v7.lastMS = ms
		v7.counter = binary.BigEndian.Uint16(u[6:8]) & 0x07ff // leave room to count up
	} else {
		v7.counter++
		if v7.counter > 0x0fff {
			v7.lastMS++ // borrow the next millisecond; stays monotonic
			v7.counter = 0
		}
		ms = v7.lastMS
	}
	c := v7.counter
	v7.Unlock()
	u[0] = byte(ms >> 40)
	u[1] = byte(ms >> 32)
	u[2] = byte(ms >> 24)
	u[3] = byte(ms >> 16)
	u[4] = byte(ms >> 8)
	u[5] = byte(ms)
	u[6] = 0x70 | byte(c>>8)
	u[7] = byte(c)
	u[8] = (u[8] & 0x3f) | 0x80
	return u
}
