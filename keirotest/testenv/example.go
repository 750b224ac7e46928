package testenv

import (
	"fmt"
	"log"
	"testing"
)

// NewExampleDB is NewDB for a package's runnable examples, which have no testing.TB: a
// migrated schema unique to the example and a pool whose search_path is that schema. Call the
// returned function when the example ends: it closes the pool and drops the schema. A failure
// to set them up ends the program with the reason, as a failed example would.
func NewExampleDB() (*DB, func()) {
	tb := &exampleTB{}
	db := NewDB(tb)
	return db, func() {
		for i := len(tb.cleanups) - 1; i >= 0; i-- {
			tb.cleanups[i]()
		}
	}
}

// exampleTB is the testing.TB of NewExampleDB: failures end the program; cleanups are kept
// for the close function.
type exampleTB struct {
	testing.TB
	cleanups []func()
}

func (t *exampleTB) Helper()                           {}
func (t *exampleTB) Logf(format string, args ...any)   { log.Printf(format, args...) }
func (t *exampleTB) Errorf(format string, args ...any) { log.Printf(format, args...) }
func (t *exampleTB) Fatalf(format string, args ...any) { log.Fatalf(format, args...) }
func (t *exampleTB) Fatal(args ...any)                 { log.Fatal(fmt.Sprint(args...)) }
func (t *exampleTB) Cleanup(f func())                  { t.cleanups = append(t.cleanups, f) }
