package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// clockTick is the unit of /proc/<pid>/stat's utime and stime (USER_HZ, 100 on Linux).
const clockTick = 10 * time.Millisecond

// procCPU returns the user and system CPU time process pid has used so far (every thread),
// from /proc/<pid>/stat, or 0 when the process is gone or pid is 0.
func procCPU(pid int) time.Duration {
	if pid <= 0 {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	return parseStatCPU(b)
}

// parseStatCPU returns utime+stime of a /proc/<pid>/stat line, or 0 when it is malformed.
func parseStatCPU(b []byte) time.Duration {
	// The command name (field 2) may hold spaces; the fields after its ')' start at state.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil || utime < 0 || stime < 0 || utime+stime < 0 || utime+stime > math.MaxInt64/int64(clockTick) {
		return 0
	}
	return time.Duration(utime+stime) * clockTick
}

// socketPorts returns the local TCP ports of process pid's sockets (its client connections).
func socketPorts(pid int) []int32 {
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return nil
	}
	inodes := map[string]bool{}
	for _, fd := range fds {
		l, err := os.Readlink(filepath.Join(fmt.Sprintf("/proc/%d/fd", pid), fd.Name()))
		if err != nil {
			continue
		}
		if in, ok := strings.CutPrefix(l, "socket:["); ok {
			inodes[strings.TrimSuffix(in, "]")] = true
		}
	}
	var ports []int32
	for _, table := range []string{"tcp", "tcp6"} {
		f, err := os.Open(fmt.Sprintf("/proc/%d/net/%s", pid, table))
		if err != nil {
			continue
		}
		ports = append(ports, parseTCPPorts(f, inodes)...)
		_ = f.Close()
	}
	return ports
}

// parseTCPPorts returns the local ports of the sockets of a /proc/net/tcp{,6} table whose
// inode is in inodes; malformed lines are skipped.
func parseTCPPorts(r io.Reader, inodes map[string]bool) []int32 {
	var ports []int32
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		// sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
		fs := strings.Fields(sc.Text())
		if len(fs) < 10 || !inodes[fs[9]] {
			continue
		}
		i := strings.LastIndexByte(fs[1], ':')
		if i < 0 {
			continue
		}
		if port, err := strconv.ParseUint(fs[1][i+1:], 16, 16); err == nil {
			ports = append(ports, int32(port))
		}
	}
	return ports
}

// backendCPU follows the PostgreSQL backends serving one contender process (the backends
// whose client port is one of the process's sockets, or whose application_name ends in
// /<pid>: its pool and, in log mode, its walsender) and adds up their CPU time. It samples every interval until stopped; a backend's
// CPU is its last sample, so a backend that exits between two samples loses at most one
// interval (backends here live as long as the contender).
type backendCPU struct {
	dsn      string
	pid      int
	interval time.Duration

	mu       sync.Mutex
	seen     map[int32]time.Duration
	stop     chan struct{}
	stopOnce sync.Once
	done     chan struct{}
}

func startBackendCPU(dsn string, pid int) *backendCPU {
	b := &backendCPU{dsn: dsn, pid: pid, interval: 200 * time.Millisecond, seen: map[int32]time.Duration{},
		stop: make(chan struct{}), done: make(chan struct{})}
	go b.loop()
	return b
}

func (b *backendCPU) loop() {
	defer close(b.done)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	conn, err := pgx.Connect(ctx, b.dsn)
	if err != nil {
		fmt.Fprintln(os.Stderr, "backend cpu:", err)
		return
	}
	defer conn.Close(context.Background())
	t := time.NewTicker(b.interval)
	defer t.Stop()
	for {
		b.sample(ctx, conn)
		select {
		case <-b.stop:
			b.sample(ctx, conn)
			return
		case <-t.C:
		}
	}
}

func (b *backendCPU) sample(ctx context.Context, conn *pgx.Conn) {
	ports := socketPorts(b.pid)
	// By the client port (a direct connection), or by the application_name a contender gives
	// its sessions, ending in /<pid> (through a proxy, whose ports these are not).
	rows, err := conn.Query(ctx, `SELECT pid FROM pg_stat_activity
		WHERE (client_addr IS NOT NULL AND client_port = ANY($1)) OR application_name LIKE '%/' || $2::text`, ports, strconv.Itoa(b.pid))
	if err != nil {
		return
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, pid := range pids {
		if c := procCPU(int(pid)); c > b.seen[pid] {
			b.seen[pid] = c
		}
	}
}

// total takes a last sample, stops the sampler and returns the backends' CPU time. Later
// calls return the same sum.
func (b *backendCPU) total() time.Duration {
	b.stopOnce.Do(func() { close(b.stop) })
	<-b.done
	b.mu.Lock()
	defer b.mu.Unlock()
	var sum time.Duration
	for _, c := range b.seen {
		sum += c
	}
	return sum
}
