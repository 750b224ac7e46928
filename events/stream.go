package events

import (
	"errors"
	"fmt"
	"strings"
	"unicode"
)

// ErrInvalidStreamName reports a stream name that is not "<category>-<id>" with a legal category
// and a non-blank id.
var ErrInvalidStreamName = errors.New("invalid stream name")

// ReservedCategory is the category name no stream may use: it names the whole log.
const ReservedCategory = "$all"

// Category returns the category of a stream name: everything before the first '-'
// ("order-42" → "order"). It returns the whole name when there is no '-'.
func Category(stream string) string {
	if i := strings.IndexByte(stream, '-'); i >= 0 {
		return stream[:i]
	}
	return stream
}

// StreamName joins a category and an id into a stream name ("order", "42" → "order-42").
func StreamName(category, id string) string { return category + "-" + id }

// ValidateStreamName checks keiro's stream-name rules: the name is "<category>-<id>"; the
// category is non-empty, contains no whitespace or control characters and is not "$all"; the id
// is not blank (it may itself contain '-').
func ValidateStreamName(stream string) error {
	i := strings.IndexByte(stream, '-')
	if i < 0 {
		return fmt.Errorf("%w %q: want <category>-<id>, for example order-42", ErrInvalidStreamName, stream)
	}
	if err := ValidateCategory(stream[:i]); err != nil {
		return fmt.Errorf("%w %q: %w", ErrInvalidStreamName, stream, err)
	}
	if strings.TrimSpace(stream[i+1:]) == "" {
		return fmt.Errorf("%w %q: the id after the first '-' is blank", ErrInvalidStreamName, stream)
	}
	return nil
}

// ValidateCategory checks a category name: non-empty, no '-', no whitespace or control
// characters, not "$all". camelCase and ':' are allowed ("wf:fulfillment").
func ValidateCategory(category string) error {
	switch {
	case category == "":
		return errors.New("category is empty")
	case category == ReservedCategory:
		return fmt.Errorf("category %q is reserved", category)
	case strings.ContainsRune(category, '-'):
		return fmt.Errorf("category %q contains the separator '-'", category)
	}
	for _, r := range category {
		if unicode.IsSpace(r) || unicode.IsControl(r) {
			return fmt.Errorf("category %q contains the illegal character %q", category, r)
		}
	}
	return nil
}
