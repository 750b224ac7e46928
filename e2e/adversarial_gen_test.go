package e2e

import (
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"pgregory.net/rapid"
)

// The adversarial suite (adversarial_*_test.go) feeds every boundary where outside bytes enter
// (outbox rows written by plain SQL, Kafka records read by the consumer, dead-letter produces)
// with generated inputs, each followed by a good item on the same key or partition, and checks
// one invariant: the bad item ends visible with its reason within its retry budget (a dead or
// rejected outbox row, a dead letter with keiro-dlq-reason, or a refusal at the boundary), the
// good item behind it is delivered exactly once, and nothing else is lost, reordered or
// duplicated.
//
// The inputs come from rapid generators drawn with fixed seeds: KEIRO_ADVERSARIAL_SEED sets the
// first seed (else one is drawn from the clock and logged), KEIRO_ADVERSARIAL_N the number of
// generated cases per boundary (make fuzz runs many; make test a few). A failure logs the seed
// and the case, so a run is reproduced with the same two variables. A fixed list of nasty cases
// runs beside the generated ones.

// Environment variables of the suite.
const (
	adversarialNEnv    = "KEIRO_ADVERSARIAL_N"
	adversarialSeedEnv = "KEIRO_ADVERSARIAL_SEED"
)

// adversarialN is the number of generated cases per boundary: KEIRO_ADVERSARIAL_N, else def.
func adversarialN(t *testing.T, def int) int {
	t.Helper()
	if s := os.Getenv(adversarialNEnv); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			t.Fatalf("%s=%q: want a number of cases (0 or more)", adversarialNEnv, s)
		}
		return n
	}
	return def
}

// adversarialSeed is the first seed of the generated cases, logged with how to reproduce the
// run (again when the test fails, next to its failure).
func adversarialSeed(t *testing.T) int {
	t.Helper()
	seed := int(time.Now().UnixNano() % 1_000_000_000)
	if s := os.Getenv(adversarialSeedEnv); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil {
			t.Fatalf("%s=%q: want an integer", adversarialSeedEnv, s)
		}
		seed = n
	}
	t.Logf("generated cases from seed %d (reproduce with %s=%d)", seed, adversarialSeedEnv, seed)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("%s failed: reproduce with %s=%d %s=%s", t.Name(), adversarialSeedEnv, seed, adversarialNEnv, os.Getenv(adversarialNEnv))
		}
	})
	return seed
}

// generate draws n values of g, the i-th from its own seed derived from seed and i: the same
// seed gives the same values, and nearby seeds share none.
func generate[V any](g *rapid.Generator[V], seed, n int) []V {
	out := make([]V, n)
	for i := range out {
		out[i] = g.Example(seed*1_000_003 + i)
	}
	return out
}

// junkRunes are the characters junk text is made of: controls (CR, LF, tab, escape, DEL), the
// characters HTTP headers, JSON and shells treat specially, the percent sign of percent-encoding,
// non-ASCII letters and emoji, a byte-order mark and the replacement character. No NUL (text
// columns and Kafka's headers-as-text paths refuse it; the NUL cases are in the fixed lists) and
// no 'q' (the suite tags items with q<number>q and finds the tags again in what arrives).
var junkRunes = []rune("\x01\x07\t\n\r\x1b\x7f \"'\\%:;,/<>{}[]=&?#+-._ aZ09éßж中\u200b\ufeff\ufffd😀")

// junkText generates text of junkRunes up to max runes (empty included).
func junkText(max int) *rapid.Generator[string] {
	return rapid.Custom(func(t *rapid.T) string {
		rs := rapid.SliceOfN(rapid.SampledFrom(junkRunes), 0, max).Draw(t, "runes")
		return string(rs)
	})
}

// junkBytes generates bytes of any value (invalid UTF-8 and NUL included) up to max.
func junkBytes(max int) *rapid.Generator[[]byte] {
	return rapid.SliceOfN(rapid.Byte(), 0, max)
}

// sizeOf is one of the sizes a key or value is drawn at: empty, one byte, small, 10 KB.
func sizeOf(t *rapid.T, label string) int {
	return rapid.SampledFrom([]int{0, 1, 7, 64, 10 << 10}).Draw(t, label)
}

// repeatTo repeats s to about n bytes (n = 0: empty), cut between characters: valid UTF-8.
func repeatTo(s string, n int) string {
	if n <= 0 || s == "" {
		return ""
	}
	r := strings.Repeat(s, n/len(s)+1)[:n]
	for !utf8.ValidString(r) {
		r = r[:len(r)-1]
	}
	return r
}

// tag is the marker of item i that the suite finds again in what a consumer or a relay
// delivered: letters and digits only, which no encoding on the way changes.
func tag(i int) string { return fmt.Sprintf("q%04dq", i) }

// shown is v for a failure message: quoted, and cut to a readable length.
func shown(v any) string {
	switch p := v.(type) {
	case *string:
		if p == nil {
			return "NULL"
		}
		v = *p
	case []byte:
		v = string(p)
	}
	s := fmt.Sprintf("%q", v)
	if len(s) > 160 {
		s = s[:160] + fmt.Sprintf("…(%d bytes)", len(s))
	}
	return s
}

// waitState polls check until it reports done, and fails t after timeout with the last state
// check described (what was seen), so that no wait of the suite hangs or fails silently.
func waitState(t *testing.T, timeout time.Duration, what string, check func() (done bool, state string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		done, state := check()
		if done {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s; last seen:\n%s", timeout, what, state)
		}
		time.Sleep(100 * time.Millisecond) // polling other processes' state; the check is the signal
	}
}

// tail is the end of a process log, for failure messages.
func logTail(p *proc) string { return tail(p.log(), 60) }

// lockedWriter appends to a builder under a mutex: a logger's output a test reads meanwhile.
type lockedWriter struct {
	mu *sync.Mutex
	b  *strings.Builder
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// newTestLogger logs text lines into b (guarded by mu), for a component run in process.
func newTestLogger(mu *sync.Mutex, b *strings.Builder) *slog.Logger {
	return slog.New(slog.NewTextHandler(lockedWriter{mu: mu, b: b}, nil))
}
