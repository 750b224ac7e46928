package schema

import (
	"encoding/json"
	"errors"
	"fmt"
)

// Limits of the pre-decoding check (see shape.check).
const (
	// maxDepth bounds the nesting of the decoded value (recursive schemas), so that a hostile
	// payload cannot exhaust the stack.
	maxDepth = 256
	// maxEmptyItems bounds the array items that take no bytes (null, empty records) in one
	// payload: goavro preallocates arrays from the block count, so an unbounded count of such
	// items would let a few bytes claim gigabytes.
	maxEmptyItems = 1 << 16
)

// shape is a schema's binary layout, built from its Parsing Canonical Form, used to check a
// payload before goavro decodes it. goavro trusts block counts (it preallocates
// make([]any, 0, count) and make(map, count)), so a 20-byte hostile payload could make it
// allocate tens of gigabytes; the check walks the bytes without allocating and rejects
// counts that the remaining bytes cannot hold.
type shape struct {
	kind     string // Avro type: null, boolean, int, long, float, double, bytes, string, record, enum, array, map, union, fixed
	fields   []*shape
	symbols  int
	items    *shape // array items, map values
	branches []*shape
	size     int // fixed
	min      int // minimum encoded size; -1 while being computed
}

var errShape = errors.New("unsupported canonical schema")

var stringShape = &shape{kind: "string"}

// errTrailing reports bytes left after the datum.
type errTrailing int

func (e errTrailing) Error() string { return fmt.Sprintf("%d trailing bytes after the datum", int(e)) }

// newShape builds the shape of a Parsing Canonical Form (full names, no namespaces,
// primitives as strings, named types defined once then referenced by name).
func newShape(canonical string) (*shape, error) {
	var v any
	if err := json.Unmarshal([]byte(canonical), &v); err != nil {
		return nil, err
	}
	names := map[string]*shape{}
	s, err := buildShape(v, names)
	if err != nil {
		return nil, err
	}
	s.minSize()
	return s, nil
}

func buildShape(v any, names map[string]*shape) (*shape, error) {
	switch x := v.(type) {
	case string:
		switch x {
		case "null", "boolean", "int", "long", "float", "double", "bytes", "string":
			return &shape{kind: x}, nil
		}
		if s := names[x]; s != nil {
			return s, nil
		}
		return nil, fmt.Errorf("%w: unknown type %q", errShape, x)
	case []any:
		s := &shape{kind: "union"}
		for _, b := range x {
			bs, err := buildShape(b, names)
			if err != nil {
				return nil, err
			}
			s.branches = append(s.branches, bs)
		}
		return s, nil
	case map[string]any:
		typ, _ := x["type"].(string)
		s := &shape{kind: typ, min: -1}
		if name, ok := x["name"].(string); ok {
			names[name] = s // before the children: recursive types refer to it
		}
		switch typ {
		case "record":
			fields, _ := x["fields"].([]any)
			for _, f := range fields {
				fm, _ := f.(map[string]any)
				fs, err := buildShape(fm["type"], names)
				if err != nil {
					return nil, err
				}
				s.fields = append(s.fields, fs)
			}
		case "enum":
			syms, _ := x["symbols"].([]any)
			s.symbols = len(syms)
		case "fixed":
			size, _ := x["size"].(float64)
			s.size = int(size)
		case "array", "map":
			key := "items"
			if typ == "map" {
				key = "values"
			}
			is, err := buildShape(x[key], names)
			if err != nil {
				return nil, err
			}
			s.items = is
		default:
			if typ == "" {
				return nil, fmt.Errorf("%w: object without type", errShape)
			}
			return buildShape(typ, names) // {"type":"int"} is not canonical, but harmless
		}
		return s, nil
	}
	return nil, fmt.Errorf("%w: %T", errShape, v)
}

// minSize returns the fewest bytes a value of s takes.
func (s *shape) minSize() int {
	switch s.kind {
	case "null":
		return 0
	case "boolean", "int", "long", "bytes", "string", "enum", "array", "map", "union":
		return 1
	case "float":
		return 4
	case "double":
		return 8
	case "fixed":
		return s.size
	case "record":
		if s.min >= 0 {
			return s.min
		}
		s.min = 0 // a record cannot contain itself except through a union, array or map
		n := 0
		for _, f := range s.fields {
			n += f.minSize()
		}
		s.min = n
		return n
	}
	return 0
}

// walker checks one payload.
type walker struct {
	buf   []byte
	empty int // zero-size array items seen
}

func (w *walker) fail(format string, a ...any) error {
	return fmt.Errorf(format, a...)
}

func (w *walker) long() (int64, error) {
	var v uint64
	for i, shift := 0, uint(0); i < 10; i, shift = i+1, shift+7 {
		if i >= len(w.buf) {
			return 0, w.fail("truncated integer")
		}
		b := w.buf[i]
		v |= uint64(b&0x7f) << shift
		if b&0x80 == 0 {
			w.buf = w.buf[i+1:]
			return int64(v>>1) ^ -int64(v&1), nil
		}
	}
	return 0, w.fail("integer longer than 10 bytes")
}

func (w *walker) skip(n int64, what string) error {
	if n < 0 || n > int64(len(w.buf)) {
		return w.fail("%s of %d bytes, %d left", what, n, len(w.buf))
	}
	w.buf = w.buf[n:]
	return nil
}

// check walks one value of s.
func (w *walker) check(s *shape, depth int) error {
	if depth > maxDepth {
		return w.fail("value nested deeper than %d levels", maxDepth)
	}
	switch s.kind {
	case "null":
		return nil
	case "boolean":
		return w.skip(1, "boolean")
	case "int", "long":
		_, err := w.long()
		return err
	case "float":
		return w.skip(4, "float")
	case "double":
		return w.skip(8, "double")
	case "fixed":
		return w.skip(int64(s.size), "fixed")
	case "bytes", "string":
		n, err := w.long()
		if err != nil {
			return err
		}
		return w.skip(n, s.kind)
	case "enum":
		i, err := w.long()
		if err != nil {
			return err
		}
		if i < 0 || i >= int64(s.symbols) {
			return w.fail("enum index %d out of %d symbols", i, s.symbols)
		}
		return nil
	case "union":
		i, err := w.long()
		if err != nil {
			return err
		}
		if i < 0 || i >= int64(len(s.branches)) {
			return w.fail("union branch %d out of %d", i, len(s.branches))
		}
		return w.check(s.branches[i], depth+1)
	case "record":
		for _, f := range s.fields {
			if err := w.check(f, depth+1); err != nil {
				return err
			}
		}
		return nil
	case "array", "map":
		itemMin := s.items.minSize()
		if s.kind == "map" {
			itemMin++ // the key string
		}
		for {
			count, err := w.long()
			if err != nil {
				return err
			}
			if count == 0 {
				return nil
			}
			if count < 0 {
				if count == -1<<63 {
					return w.fail("invalid block count")
				}
				count = -count
				if _, err := w.long(); err != nil { // block size in bytes, unused
					return err
				}
			}
			if itemMin > 0 && count > int64(len(w.buf))/int64(itemMin) {
				return w.fail("%s block of %d items cannot fit in the %d bytes left", s.kind, count, len(w.buf))
			}
			if itemMin == 0 {
				if w.empty += int(min(count, maxEmptyItems+1)); w.empty > maxEmptyItems {
					return w.fail("more than %d empty array items", maxEmptyItems)
				}
			}
			for range count {
				if s.kind == "map" {
					if err := w.check(stringShape, depth+1); err != nil {
						return err
					}
				}
				if err := w.check(s.items, depth+1); err != nil {
					return err
				}
			}
		}
	}
	return w.fail("unknown type %q", s.kind)
}

// checkBody reports whether body holds exactly one value of s, without allocating.
func checkBody(s *shape, body []byte) error {
	w := walker{buf: body}
	if err := w.check(s, 0); err != nil {
		return err
	}
	if len(w.buf) != 0 {
		return errTrailing(len(w.buf))
	}
	return nil
}
