// Package pgbouncer runs a real PgBouncer process in transaction pooling mode in front of the
// test PostgreSQL server (KEIRO_TEST_DATABASE_URL), on a free loopback port, for tests that must
// prove a component works through it.
//
// A test that needs PgBouncer fails, never skips, when the binary is missing: install Debian's
// pgbouncer package (.ci/run does).
package pgbouncer

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/keiro-go/keiro/keirotest/testenv"
)

// Binary is where Debian installs pgbouncer; PATH is searched when it is not there.
const Binary = "/usr/sbin/pgbouncer"

// Bouncer is a running PgBouncer in transaction pooling mode.
type Bouncer struct {
	// Addr is the loopback host:port PgBouncer listens on.
	Addr string

	cmd  *exec.Cmd
	done chan struct{}
	mu   sync.Mutex
	log  strings.Builder
}

// Start runs PgBouncer (pool_mode=transaction, auth_type=any) in front of the test PostgreSQL
// server and returns once it listens. It is stopped when t ends.
func Start(t testing.TB) *Bouncer {
	t.Helper()
	bin := Binary
	if _, err := os.Stat(bin); err != nil {
		p, lerr := exec.LookPath("pgbouncer")
		if lerr != nil {
			t.Fatalf("pgbouncer is not installed (%s, nor on PATH): install Debian's pgbouncer package (.ci/run does)", Binary)
		}
		bin = p
	}
	up, err := url.Parse(testenv.DatabaseURL())
	if err != nil {
		t.Fatalf("parse the test database URL: %v", err)
	}
	host, port := up.Hostname(), up.Port()
	if port == "" {
		port = "5432"
	}
	dbUser := "postgres"
	if up.User != nil && up.User.Username() != "" {
		dbUser = up.User.Username()
	}
	var lastErr error
	for range 5 { // the free port may be taken between probing it and PgBouncer binding it
		b, err := start(t, bin, host, port, dbUser)
		if err == nil {
			return b
		}
		lastErr = err
	}
	t.Fatalf("start pgbouncer: %v", lastErr)
	return nil
}

func start(t testing.TB, bin, host, port, dbUser string) (*Bouncer, error) {
	dir, err := os.MkdirTemp("", "keiro-pgbouncer-")
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	// PgBouncer refuses to run as root; it then switches to the postgres user, which must be
	// able to read its configuration.
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, err
	}
	listenPort, err := freePort()
	if err != nil {
		return nil, err
	}
	ini := fmt.Sprintf(`[databases]
* = host=%s port=%s user=%s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = any
pool_mode = transaction
max_client_conn = 500
default_pool_size = 20
server_reset_query =
ignore_startup_parameters = extra_float_digits,search_path
server_login_retry = 1
`, host, port, dbUser, listenPort)
	conf := filepath.Join(dir, "pgbouncer.ini")
	if err := os.WriteFile(conf, []byte(ini), 0o644); err != nil {
		return nil, err
	}
	args := []string{conf}
	if os.Geteuid() == 0 {
		if _, err := user.Lookup("postgres"); err != nil {
			return nil, fmt.Errorf("pgbouncer does not run as root and there is no postgres user to switch to: %w", err)
		}
		args = append([]string{"-u", "postgres"}, args...)
	}
	cmd := exec.Command(bin, args...)
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("run %s: %w", bin, err)
	}
	b := &Bouncer{Addr: fmt.Sprintf("127.0.0.1:%d", listenPort), cmd: cmd, done: make(chan struct{})}
	listening := make(chan struct{})
	scanned := make(chan struct{})
	go func() {
		defer close(scanned)
		sc := bufio.NewScanner(pr)
		signalled := false
		for sc.Scan() {
			line := sc.Text()
			b.mu.Lock()
			b.log.WriteString(line + "\n")
			b.mu.Unlock()
			if !signalled && strings.Contains(line, "listening on 127.0.0.1:") {
				signalled = true
				close(listening)
			}
		}
		_, _ = io.Copy(io.Discard, pr)
	}()
	go func() {
		_ = cmd.Wait()
		_ = pw.Close()
		<-scanned
		close(b.done)
	}()
	t.Cleanup(b.stop)
	select {
	case <-listening:
		return b, nil
	case <-b.done:
		return nil, fmt.Errorf("pgbouncer exited before listening:\n%s", b.Log())
	case <-time.After(30 * time.Second):
		b.stop()
		return nil, fmt.Errorf("pgbouncer did not listen within 30s:\n%s", b.Log())
	}
}

// URL returns the test database URL with its host and port replaced by PgBouncer's.
func (b *Bouncer) URL() string {
	u, _ := url.Parse(testenv.DatabaseURL()) // parsed by Start
	u.Host = b.Addr
	return u.String()
}

// Log returns what PgBouncer has logged so far.
func (b *Bouncer) Log() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.log.String()
}

func (b *Bouncer) stop() {
	select {
	case <-b.done:
		return
	default:
	}
	_ = b.cmd.Process.Signal(syscall.SIGINT) // immediate shutdown
	select {
	case <-b.done:
	case <-time.After(10 * time.Second):
		_ = b.cmd.Process.Kill()
		<-b.done
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free loopback port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
