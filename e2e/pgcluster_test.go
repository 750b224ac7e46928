package e2e

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// pgCluster is a PostgreSQL cluster of the test's own (initdb into t.TempDir(), a free port on
// loopback), for tests that restart or crash the server: the shared server on 5432 serves the
// other tests in parallel and is never restarted.
type pgCluster struct {
	bin  string // the server's bin directory (/usr/lib/postgresql/<version>/bin)
	data string // the data directory
	log  string // the server's log file
	Port int
	URL  string // trust auth as postgres, database postgres
	// asPostgres: initdb and postgres refuse to run as root, so as root the cluster runs as the
	// postgres OS user (runuser), with the data directory owned by it.
	asPostgres bool
}

// startPGCluster initdbs and starts a cluster with wal_level=logical, replication slots and
// walsenders for log mode, and trust auth on 127.0.0.1. It is stopped when t ends. The test
// fails, never skips, if the cluster cannot start.
func startPGCluster(t *testing.T) *pgCluster {
	t.Helper()
	bin, err := postgresBin()
	if err != nil {
		t.Fatalf("private PostgreSQL cluster: %v", err)
	}
	dir := t.TempDir()
	c := &pgCluster{bin: bin, data: filepath.Join(dir, "data"), log: filepath.Join(dir, "server.log"),
		asPostgres: os.Geteuid() == 0}
	if c.asPostgres {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("private PostgreSQL cluster: running as root, and initdb refuses root: no postgres OS user to run it as: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		// t.TempDir's directories are 0700 root: let postgres through to its own.
		for _, d := range []string{filepath.Dir(dir), dir} {
			if err := os.Chmod(d, 0o711); err != nil {
				t.Fatalf("private PostgreSQL cluster: %v", err)
			}
		}
		for _, p := range []string{c.data, c.log} {
			if p == c.data {
				err = os.Mkdir(p, 0o700)
			} else {
				err = os.WriteFile(p, nil, 0o600)
			}
			if err == nil {
				err = os.Chown(p, uid, gid)
			}
			if err != nil {
				t.Fatalf("private PostgreSQL cluster: %v", err)
			}
		}
	}
	c.Port = freePort(t)
	c.URL = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.Port)
	if out, err := c.run("initdb", "-D", c.data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"); err != nil {
		t.Fatalf("private PostgreSQL cluster: initdb: %v\n%s", err, out)
	}
	conf := fmt.Sprintf(`
listen_addresses = '127.0.0.1'
port = %d
unix_socket_directories = ''
wal_level = logical
max_wal_senders = 8
max_replication_slots = 8
max_connections = 50
shared_buffers = 32MB
fsync = off
`, c.Port)
	f, err := os.OpenFile(filepath.Join(c.data, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err == nil {
		_, err = f.WriteString(conf)
		err = errors.Join(err, f.Close())
	}
	if err != nil {
		t.Fatalf("private PostgreSQL cluster: write postgresql.conf: %v", err)
	}
	if out, err := c.run("pg_ctl", "-D", c.data, "-l", c.log, "-w", "-t", "60", "start"); err != nil {
		t.Fatalf("private PostgreSQL cluster: start: %v\n%s\n%s", err, out, c.serverLog())
	}
	t.Cleanup(func() {
		if out, err := c.run("pg_ctl", "-D", c.data, "-m", "immediate", "-w", "stop"); err != nil {
			t.Errorf("private PostgreSQL cluster: stop: %v\n%s", err, out)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.URL)
	if err != nil {
		t.Fatalf("private PostgreSQL cluster: connect: %v\n%s", err, c.serverLog())
	}
	_ = conn.Close(ctx)
	return c
}

// restart runs pg_ctl restart with mode (fast: a clean shutdown; immediate: a crash, recovered
// from the WAL at start) and waits for the server to accept connections again. The new server
// logs to the log file too: with its output on ours, run would wait for it to exit.
func (c *pgCluster) restart(t *testing.T, mode string) {
	t.Helper()
	if out, err := c.run("pg_ctl", "-D", c.data, "-l", c.log, "-m", mode, "-w", "-t", "60", "restart"); err != nil {
		t.Fatalf("private PostgreSQL cluster: restart -m %s: %v\n%s\n%s", mode, err, out, c.serverLog())
	}
}

func (c *pgCluster) run(name string, args ...string) ([]byte, error) {
	prog := filepath.Join(c.bin, name)
	var cmd *exec.Cmd
	if c.asPostgres {
		cmd = exec.Command("runuser", slices.Concat([]string{"-u", "postgres", "--", prog}, args)...)
	} else {
		cmd = exec.Command(prog, args...)
	}
	cmd.Dir = "/" // postgres may not enter the test's working directory
	return cmd.CombinedOutput()
}

// serverLog is the end of the server's log, for failure messages.
func (c *pgCluster) serverLog() string { return tail(c.serverLogAll(), 30) }

// serverLogAll is the server's whole log.
func (c *pgCluster) serverLogAll() string {
	b, _ := os.ReadFile(c.log)
	return string(b)
}

// postgresBin is the newest server's bin directory under /usr/lib/postgresql, as
// scripts/postgres finds it.
func postgresBin() (string, error) {
	ents, err := os.ReadDir("/usr/lib/postgresql")
	if err != nil {
		return "", fmt.Errorf("no PostgreSQL server under /usr/lib/postgresql (run scripts/postgres): %w", err)
	}
	best, bestV := "", -1
	for _, e := range ents {
		v, err := strconv.Atoi(strings.SplitN(e.Name(), ".", 2)[0])
		if err != nil {
			continue
		}
		bin := filepath.Join("/usr/lib/postgresql", e.Name(), "bin")
		if _, err := os.Stat(filepath.Join(bin, "initdb")); err == nil && v > bestV {
			best, bestV = bin, v
		}
	}
	if best == "" {
		return "", fmt.Errorf("no initdb under /usr/lib/postgresql/<version>/bin (run scripts/postgres)")
	}
	return best, nil
}

// freePort is a loopback TCP port nobody listens on now.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
