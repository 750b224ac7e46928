package testenv

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// CPUMeter measures what a benchmark's timed part costs the machine in CPU: this process's
// time (getrusage: the components under test and an in-process kfake), the time of the
// PostgreSQL processes serving it (the client backends whose application_name is the meter's,
// and the server's background processes: WAL writer, checkpointer, autovacuum; read from
// /proc, so the server must run on this machine) and every core's busy time, other work on
// the machine included. Name the pools under test with application_name so their backends are
// counted:
//
//	pc.ConnConfig.RuntimeParams["application_name"] = "bench-consumers"
//	m := testenv.StartCPU(b, db, "bench-consumers")
//	// ... the timed part ...
//	f := m.Stop(b) // before the pools close: an ended backend's time is not counted
//	b.ReportMetric(f.PerMessage(n), "cpu-us/msg")
type CPUMeter struct {
	db      *DB
	appName string
	start   time.Time
	self    time.Duration
	busy    time.Duration
	pg      map[int]time.Duration
}

// CPUFigures are what a CPUMeter measured between StartCPU and Stop.
type CPUFigures struct {
	// Elapsed is the wall time.
	Elapsed time.Duration
	// Self is this process's CPU time; Postgres that of the PostgreSQL processes serving it.
	Self, Postgres time.Duration
	// MachineBusy is every core's busy time, whoever used it.
	MachineBusy time.Duration
	// Cores is the machine's number of cores (not GOMAXPROCS: the database uses them too).
	Cores int
}

// Total is Self and Postgres together: the CPU the measured work cost the machine.
func (f CPUFigures) Total() time.Duration { return f.Self + f.Postgres }

// PerMessage is Total in microseconds per message, for n messages.
func (f CPUFigures) PerMessage(n int) float64 {
	return float64(f.Total().Microseconds()) / float64(max(n, 1))
}

// PostgresPerMessage is Postgres in microseconds per message, for n messages: what users size
// their database by.
func (f CPUFigures) PostgresPerMessage(n int) float64 {
	return float64(f.Postgres.Microseconds()) / float64(max(n, 1))
}

// BoundRate is the rate of messages per second the measured CPU allows on the machine's cores
// (cores / CPU seconds per message): the limit of the same work on this machine, measured in
// the same run.
func (f CPUFigures) BoundRate(n int) float64 {
	if f.Total() <= 0 {
		return 0
	}
	return float64(f.Cores) * float64(n) / f.Total().Seconds()
}

// MachineBusyPercent is the share of the machine's cores that was busy, in percent.
func (f CPUFigures) MachineBusyPercent() float64 {
	if f.Elapsed <= 0 {
		return 0
	}
	return 100 * f.MachineBusy.Seconds() / (float64(f.Cores) * f.Elapsed.Seconds())
}

// StartCPU starts measuring: appName names the client backends of the work under test.
func StartCPU(tb testing.TB, db *DB, appName string) *CPUMeter {
	tb.Helper()
	m := &CPUMeter{db: db, appName: appName}
	m.pg = m.postgresCPU(tb)
	m.self, m.busy, m.start = processCPU(), machineBusy(), time.Now()
	return m
}

// Stop ends the measurement. Call it while the measured pools are still open: the CPU of a
// backend that ended before Stop is not counted.
func (m *CPUMeter) Stop(tb testing.TB) CPUFigures {
	tb.Helper()
	f := CPUFigures{Elapsed: time.Since(m.start), Self: processCPU() - m.self, MachineBusy: machineBusy() - m.busy, Cores: numCPU()}
	for pid, t := range m.postgresCPU(tb) {
		f.Postgres += t - m.pg[pid]
	}
	return f
}

// postgresCPU is the CPU time of each PostgreSQL process serving the benchmark, by pid.
func (m *CPUMeter) postgresCPU(tb testing.TB) map[int]time.Duration {
	tb.Helper()
	rows, err := m.db.Pool.Query(context.Background(), `SELECT pid FROM pg_stat_activity
		WHERE backend_type <> 'client backend' OR application_name = $1`, m.appName)
	if err != nil {
		tb.Fatalf("testenv: list the PostgreSQL processes to measure: %v", err)
	}
	defer rows.Close()
	out := map[int]time.Duration{}
	for rows.Next() {
		var pid int
		if err := rows.Scan(&pid); err != nil {
			tb.Fatalf("testenv: list the PostgreSQL processes to measure: %v", err)
		}
		if t, ok := procCPU(pid); ok {
			out[pid] = t
		}
	}
	if err := rows.Err(); err != nil {
		tb.Fatalf("testenv: list the PostgreSQL processes to measure: %v", err)
	}
	return out
}

// clockTick is the unit of /proc's CPU times (USER_HZ, 100 on Linux).
const clockTick = 10 * time.Millisecond

// procCPU is a process's CPU time (user and system) from /proc; false when it ended or runs on
// another machine.
func procCPU(pid int) (time.Duration, bool) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, false
	}
	// The fields after the command's closing parenthesis (the command may hold spaces).
	f := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+1:]))
	if len(f) < 13 {
		return 0, false
	}
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * clockTick, true
}

// processCPU is this process's CPU time (user and system).
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// machineBusy is the busy time of every core since boot (/proc/stat: all but idle and iowait).
func machineBusy() time.Duration {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	f := strings.Fields(strings.SplitN(string(data), "\n", 2)[0])[1:]
	var busy int64
	for i, v := range f {
		n, _ := strconv.ParseInt(v, 10, 64)
		if i != 3 && i != 4 && i < 8 { // idle, iowait; guest times are in user already
			busy += n
		}
	}
	return time.Duration(busy) * clockTick
}

// numCPU is the number of cores the machine has.
func numCPU() int {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 1
	}
	n := 0
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "cpu") && !strings.HasPrefix(line, "cpu ") {
			n++
		}
	}
	return max(n, 1)
}
