package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/keiro-go/keiro/outbox"
)

// debeziumMain is the Java class of bench/debezium that runs Debezium embedded.
const debeziumMain = "keiro.bench.DebeziumRelay"

// debeziumBuild compiles bench/debezium (dir) with Maven once and returns the java classpath
// of its class and dependencies. It rebuilds when pom.xml or a source is newer than the last
// build; Maven runs offline first (the jars are in its local repository after the first
// resolution) and online only if that fails.
func debeziumBuild(ctx context.Context, dir string) (string, error) {
	// Maven resolves a relative output file against the project's directory, not ours.
	dir, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	cpFile := filepath.Join(dir, "target", "classpath")
	classes := filepath.Join(dir, "target", "classes")
	if fresh(dir, cpFile) {
		if b, err := os.ReadFile(cpFile); err == nil {
			return classes + string(os.PathListSeparator) + strings.TrimSpace(string(b)), nil
		}
	}
	if _, err := exec.LookPath("mvn"); err != nil {
		return "", errors.New("mvn not found: the debezium contenders are built by Maven (Java 17 and Maven 3)")
	}
	var out bytes.Buffer
	for _, offline := range []bool{true, false} {
		args := []string{"-q", "-B"}
		if offline {
			args = append(args, "-o")
		}
		args = append(args, "-f", filepath.Join(dir, "pom.xml"), "compile", "dependency:build-classpath",
			"-Dmdep.includeScope=runtime", "-Dmdep.outputFile="+cpFile)
		out.Reset()
		cmd := exec.CommandContext(ctx, "mvn", args...)
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err == nil {
			b, err := os.ReadFile(cpFile)
			if err != nil {
				return "", err
			}
			return classes + string(os.PathListSeparator) + strings.TrimSpace(string(b)), nil
		}
	}
	return "", fmt.Errorf("build %s with Maven:\n%s", dir, out.String())
}

// fresh reports whether built exists and is newer than dir's pom.xml and Java sources.
func fresh(dir, built string) bool {
	st, err := os.Stat(built)
	if err != nil {
		return false
	}
	newer := false
	_ = filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && d.Name() == "target" {
			return filepath.SkipDir
		}
		if !d.IsDir() && (strings.HasSuffix(path, ".java") || d.Name() == "pom.xml") {
			if fi, err := d.Info(); err == nil && fi.ModTime().After(st.ModTime()) {
				newer = true
			}
		}
		return nil
	})
	return !newer
}

// debeziumCommand returns the command that runs Debezium embedded over schema's
// keiro_outbox_log on slot (whose publication has the same name), producing to brokers.
func debeziumCommand(classpath, dsn, schema, slot string, brokers []string, variant string) (*exec.Cmd, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	host := cfg.Host
	if strings.HasPrefix(host, "/") { // a Unix socket: Debezium connects over TCP
		host = "127.0.0.1"
	}
	return exec.Command("java", "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn", "-cp", classpath, debeziumMain,
		host, strconv.Itoa(int(cfg.Port)), cfg.User, cfg.Password, cfg.Database, schema, slot, slot,
		strings.Join(brokers, ","), variant), nil
}

// logSlots prepares a run whose contender reads keiro_outbox_log: it switches schema to log
// mode (producers then write keiro_outbox_log; keiro's slot and publication are created) and,
// for Debezium, creates Debezium's own slot and publication (inserts of keiro_outbox_log only)
// before any event is written, so that both decode every event of the run. It returns
// Debezium's slot ("" for keiro) and the cleanup that drops every slot and publication.
func (p *parent) logSlots(ctx context.Context, conn *pgx.Conn, schema string, c contender) (string, func(), error) {
	admin, err := outbox.NewAdmin(schema)
	if err != nil {
		return "", func() {}, err
	}
	slots := []string{outbox.DefaultLogSlot(schema)}
	cleanup := func() { p.dropSlots(slots) }
	if _, err := admin.SetMode(ctx, conn, outbox.ModeLog, ""); err != nil {
		return "", cleanup, fmt.Errorf("switch to log mode: %w", err)
	}
	if c.kind != kindDebezium {
		return "", cleanup, nil
	}
	slot := "dbz_" + schema
	slots = append(slots, slot)
	if _, err := conn.Exec(ctx, fmt.Sprintf(`CREATE PUBLICATION %s FOR TABLE %s.keiro_outbox_log WITH (publish = 'insert')`, slot, schema)); err != nil {
		return "", cleanup, fmt.Errorf("create Debezium's publication: %w", err)
	}
	if _, err := conn.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, slot); err != nil {
		return "", cleanup, fmt.Errorf("create Debezium's slot: %w", err)
	}
	return slot, cleanup, nil
}

// dropSlots drops the replication slots and publications of a run once their readers exited
// (a walsender releases its slot shortly after its client went away).
func (p *parent) dropSlots(slots []string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, p.o.dsn)
	if err != nil {
		fmt.Fprintln(os.Stderr, "drop slots:", err)
		return
	}
	defer conn.Close(context.Background())
	for _, slot := range slots {
		_, _ = conn.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL`, slot)
		var err error
		for ctx.Err() == nil {
			if _, err = conn.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, slot); err == nil {
				break
			}
			time.Sleep(50 * time.Millisecond) // waiting for a terminated walsender to release the slot
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "drop slot %s: %v\n", slot, err)
		}
		if _, err := conn.Exec(ctx, "DROP PUBLICATION IF EXISTS "+slot); err != nil {
			fmt.Fprintf(os.Stderr, "drop publication %s: %v\n", slot, err)
		}
	}
}
