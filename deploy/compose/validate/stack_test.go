package validate_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/compose-spec/compose-go/v2/types"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/keiro-go/keiro/deploy/compose/validate"
	"github.com/keiro-go/keiro/keirotest/testenv"
)

// The services of docker-compose.yml the stack test runs as processes, and the log line in
// which each announces its HTTP address (the default text log format).
var stackServices = []struct {
	name   string
	addrRe *regexp.Regexp
}{
	{"relay", regexp.MustCompile(`msg="http server listening" addr=(\S+)`)},
	{"consumer", regexp.MustCompile(`msg="serving /healthz, /readyz and /metrics" addr=(\S+)`)},
}

// stackConfig configures runStack.
type stackConfig struct {
	// orders is the demo producer's N; 0 stops after the healthchecks.
	orders int
	// skipChecks runs without validate.CheckProject first, to show that the run itself
	// fails on a broken file, not only the up-front check.
	skipChecks bool
	// healthWait bounds the wait for each healthcheck to pass. Defaults to 60s.
	healthWait time.Duration
}

// Bounds of the waits on another process's progress (generous: the machine is shared).
const (
	addrWait   = 60 * time.Second
	ordersWait = 90 * time.Second
	tracesWait = 60 * time.Second
)

// TestComposeStack runs the compose stack's relay and consumer with exactly the environment,
// command and healthcheck docker-compose.yml gives them, on a real Kafka and PostgreSQL, with
// the stack's init SQL and demo producer; only the compose network's host names (and the
// database and listen addresses, see composeEnv) are mapped onto this machine.
func TestComposeStack(t *testing.T) {
	if err := runStack(t, filepath.Join(repoRoot(t), "docker-compose.yml"), stackConfig{orders: 20}); err != nil {
		t.Fatal(err)
	}
}

// TestComposeStackFindsBrokenFile runs copies of docker-compose.yml with one thing broken and
// expects each run to report it: by the up-front check, or by the processes themselves
// (skipChecks) when a broken variable makes a binary refuse to start or a healthcheck
// command cannot pass.
func TestComposeStackFindsBrokenFile(t *testing.T) {
	cases := []struct {
		name       string
		old, new   string
		skipChecks bool
		want       string
	}{
		{"misspelt variable", "KEIRO_RELAY_BROKERS: kafka:9092", "KEIRO_RELAY_BROKER: kafka:9092", false,
			"KEIRO_RELAY_BROKER is not read by relay"},
		{"misspelt variable, run", "KEIRO_RELAY_BROKERS: kafka:9092", "KEIRO_RELAY_BROKER: kafka:9092", true,
			"relay exited with code 2"},
		{"consumer topic not created", "KEIRO_CONSUMER_TOPICS: billing.orders.v1", "KEIRO_CONSUMER_TOPICS: billing.order.v1", false,
			"kafka-init does not create billing.order.v1"},
		{"dead-letter topic not created", "TOPICS: billing.orders.v1:6 billing.orders.v1.dlq:1", "TOPICS: billing.orders.v1:6", false,
			"kafka-init does not create billing.orders.v1.dlq"},
		{"healthcheck subcommand", `"/usr/local/bin/consumer", "healthcheck"`, `"/usr/local/bin/consumer", "health"`, false,
			"consumer's healthcheck [/usr/local/bin/consumer health] exited with code 2"},
		{"healthcheck binary", `"/usr/local/bin/relay", "healthcheck"`, `"/usr/local/bin/consumer", "healthcheck"`, true,
			"relay's healthcheck runs /usr/local/bin/consumer"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			file := brokenCompose(t, c.old, c.new)
			err := runStack(t, file, stackConfig{skipChecks: c.skipChecks, healthWait: 20 * time.Second})
			if err == nil {
				t.Fatal("the stack ran with a broken compose file")
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error does not say %q:\n%v", c.want, err)
			}
		})
	}
}

// brokenCompose writes a copy of docker-compose.yml with old replaced by new into a temporary
// directory that links the files the compose file refers to.
func brokenCompose(t *testing.T, old, new string) string {
	t.Helper()
	root := repoRoot(t)
	b, err := os.ReadFile(filepath.Join(root, "docker-compose.yml"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), old) {
		t.Fatalf("docker-compose.yml no longer contains %q; update this test", old)
	}
	dir := t.TempDir()
	for _, name := range []string{"Dockerfile", ".dockerignore", "deploy"} {
		if err := os.Symlink(filepath.Join(root, name), filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	file := filepath.Join(dir, "docker-compose.yml")
	if err := os.WriteFile(file, []byte(strings.Replace(string(b), old, new, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	return file
}

// runStack runs the compose file's relay and consumer as described on TestComposeStack. It
// returns the problems the compose file causes; failures of the test's own set-up fail t.
func runStack(t *testing.T, composeFile string, cfg stackConfig) error {
	t.Helper()
	if cfg.healthWait == 0 {
		cfg.healthWait = 60 * time.Second
	}
	ctx := context.Background()
	p, err := validate.LoadProject(ctx, composeFile, nil)
	if err != nil {
		return err
	}
	if !cfg.skipChecks {
		if err := validate.CheckProject(p); err != nil {
			return err
		}
	}
	topics, err := validate.InitTopics(p)
	if err != nil {
		return err
	}

	// The compose network, mapped onto this machine.
	var groups []string
	for _, sv := range stackServices {
		if g := p.Services[sv.name].Environment["KEIRO_CONSUMER_GROUP"]; g != nil {
			groups = append(groups, *g)
		}
	}
	k := createTopics(t, topics, groups)
	registry := newComposeRegistry(t)
	otlp := newOTLPSink(t)
	db := newComposeDatabase(t)
	network := validate.Network{
		"postgres:5432":        db.hostport,
		"postgres":             db.host,
		"kafka:9092":           strings.Join(k.Seeds, ","),
		"schema-registry:8081": registry,
		"jaeger:4318":          otlp.hostport,
	}
	if err := applyInitSQL(t, p, network, db); err != nil {
		return err
	}

	type service struct {
		name string
		env  map[string]string
		proc *proc
	}
	var started []*service
	for _, sv := range stackServices {
		env, argv, err := composeService(p, sv.name, network, db.name)
		if err != nil {
			return err
		}
		// The compose file listens on 0.0.0.0:946x, which inside a container is private to the
		// container's network namespace. Here it would take a fixed port on every interface of
		// a shared machine (colliding with a parallel run or anything else on it), so each
		// binary listens on a free loopback port and the healthcheck is given the port it got.
		addrEnv := validate.HTTPAddrEnv(sv.name)
		env[addrEnv] = "127.0.0.1:0"
		pr, err := startProc(t, sv.name, argv, env, sv.addrRe)
		if err != nil {
			return err
		}
		addr, err := pr.waitAddr(addrWait)
		if err != nil {
			return err
		}
		env[addrEnv] = addr
		started = append(started, &service{sv.name, env, pr})
	}
	for _, s := range started {
		if err := waitHealthy(p, s.name, s.env, s.proc, cfg.healthWait); err != nil {
			return err
		}
	}
	if cfg.orders > 0 {
		if err := runDemoOrders(t, p, network, db.name, cfg.orders); err != nil {
			return err
		}
		if err := waitOrdersApplied(db, started[len(started)-1].proc); err != nil {
			return err
		}
		if err := otlp.waitTraces(tracesWait); err != nil {
			return err
		}
	}
	for _, s := range started {
		grace := 30 * time.Second
		if g := p.Services[s.name].StopGracePeriod; g != nil {
			grace = time.Duration(*g)
		}
		if code, err := s.proc.stop(grace); err != nil {
			return err
		} else if code != 0 {
			return fmt.Errorf("%s exited with code %d after SIGTERM:\n%s", s.name, code, tail(s.proc.log(), 30))
		}
	}
	return nil
}

// composeService returns the environment and argv of a service built from the Dockerfile, as
// its container gets them, with the compose network's addresses mapped by net and the
// database name replaced by dbName; argv[0] is the locally built binary.
func composeService(p *types.Project, name string, network validate.Network, dbName string) (map[string]string, []string, error) {
	env, err := validate.ServiceEnv(p, name)
	if err != nil {
		return nil, nil, err
	}
	argv, err := validate.ServiceCommand(p, name)
	if err != nil {
		return nil, nil, err
	}
	img, _, err := validate.ServiceImage(p, name)
	if err != nil {
		return nil, nil, err
	}
	if argv[0] != img.Entrypoint[0] {
		return nil, nil, fmt.Errorf("service %q runs %s, not the image's binary %s", name, argv[0], img.Entrypoint[0])
	}
	bin, err := binary(img.Binary())
	if err != nil {
		return nil, nil, err
	}
	argv[0] = bin
	for k, v := range env {
		env[k] = mapDatabase(k, network.Rewrite(v), dbName)
	}
	return env, argv, nil
}

// mapDatabase points a database URL or PGDATABASE at the test's database instead of the
// compose stack's.
func mapDatabase(key, value, dbName string) string {
	switch {
	case key == "PGDATABASE":
		return dbName
	case strings.HasSuffix(key, "_DATABASE_URL"):
		u, err := url.Parse(value)
		if err != nil {
			return value // the binary reports it
		}
		u.Path = "/" + dbName
		return u.String()
	}
	return value
}

// waitHealthy runs the service's compose healthcheck with the service's environment until it
// exits 0, within wait. Exit code 1 is "unhealthy, ask again"; any other code fails at once
// (Docker reserves 2: the command itself is wrong), as does the service exiting.
func waitHealthy(p *types.Project, name string, env map[string]string, pr *proc, wait time.Duration) error {
	hc := p.Services[name].HealthCheck
	if hc == nil || hc.Disable || len(hc.Test) < 2 || hc.Test[0] != "CMD" {
		return fmt.Errorf("service %q: healthcheck %v is not an exec-form CMD the test can run", name, hc)
	}
	img, _, err := validate.ServiceImage(p, name)
	if err != nil {
		return err
	}
	argv := slices.Clone([]string(hc.Test[1:]))
	if argv[0] != img.Entrypoint[0] {
		return fmt.Errorf("%s's healthcheck runs %s, which is not in image %q (its binary is %s)", name, argv[0], img.Stage, img.Entrypoint[0])
	}
	if argv[0], err = binary(img.Binary()); err != nil {
		return err
	}
	deadline := time.Now().Add(wait)
	for {
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Env = processEnv(env)
		out, err := cmd.CombinedOutput()
		code := 0
		if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			return fmt.Errorf("run %s's healthcheck: %w", name, err)
		}
		switch {
		case code == 0:
			return nil
		case code != 1:
			return fmt.Errorf("%s's healthcheck %v exited with code %d (0 healthy, 1 unhealthy, other codes are reserved):\n%s", name, hc.Test[1:], code, out)
		case pr.exited():
			return fmt.Errorf("%s exited with code %d while its healthcheck failed (%s):\n%s", name, pr.exitCode(), strings.TrimSpace(string(out)), tail(pr.log(), 30))
		case time.Now().After(deadline):
			return fmt.Errorf("%s's healthcheck %v did not pass within %s: %s\n%s", name, hc.Test[1:], wait, strings.TrimSpace(string(out)), tail(pr.log(), 30))
		}
		select {
		case <-pr.done:
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// createTopics creates the stack's topics under their literal names (the compose file's, not
// a test namespace) on the real broker, and deletes them and the consumer groups at cleanup.
// newComposeRegistry serves the real schema registry (Apicurio's Confluent API, shared by the
// binary) at the root of a loopback port, where the compose file's services expect Confluent's
// registry (http://schema-registry:8081), and returns that host:port.
func newComposeRegistry(t *testing.T) string {
	t.Helper()
	target, err := url.Parse(testenv.NewSchemaRegistry(t).URL)
	if err != nil {
		t.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(target)
	transport := &http.Transport{}
	proxy.Transport = transport
	srv := httptest.NewServer(proxy)
	t.Cleanup(transport.CloseIdleConnections)
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

func createTopics(t *testing.T, topics []validate.Topic, groups []string) *testenv.Kafka {
	t.Helper()
	k := testenv.NewRealKafka(t)
	var names []string
	for _, topic := range topics {
		names = append(names, topic.Name)
	}
	// The names are the stack's own, not a test namespace: on a broker that has them already
	// (KEIRO_TEST_KAFKA_BROKERS pointing at a running compose stack) the test would delete
	// someone's topics, so it refuses.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	adm := kadm.NewClient(k.Client)
	all, err := adm.ListTopics(ctx) // all topics: asking for missing ones by name reports them with an error
	if err != nil {
		t.Fatalf("list topics: %v", err)
	}
	for _, name := range names {
		if all.Has(name) {
			t.Fatalf("the broker %v already has topic %s; this test creates and deletes the compose stack's topics under their own names, so run it on a broker without them", k.Seeds, name)
		}
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := adm.DeleteTopics(ctx, names...); err != nil {
			t.Logf("delete topics %v: %v", names, err)
		}
		if len(groups) > 0 {
			res, err := adm.DeleteGroups(ctx, groups...)
			if err != nil {
				t.Logf("delete consumer groups %v: %v", groups, err)
			}
			for _, r := range res {
				if r.Err != nil && !errors.Is(r.Err, kerr.GroupIDNotFound) { // never joined
					t.Logf("delete consumer group %s: %v", r.Group, r.Err)
				}
			}
		}
	})
	for _, topic := range topics {
		k.CreateTopic(t, topic.Name, topic.Partitions)
	}
	return k
}

// composeDB is the test's database standing in for the compose stack's.
type composeDB struct {
	name, host, hostport string
	url                  string // as postgres, for the test's own queries
}

// newComposeDatabase creates the compose stack's role (keiro, password keiro) when missing
// and a fresh database it owns, dropped at cleanup.
func newComposeDatabase(t *testing.T) *composeDB {
	t.Helper()
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, testenv.DatabaseURL())
	if err != nil {
		t.Fatalf("connect to PostgreSQL (bash scripts/postgres starts it): %v", err)
	}
	defer admin.Close(ctx)
	_, err = admin.Exec(ctx, `DO $$ BEGIN
  CREATE ROLE keiro LOGIN PASSWORD 'keiro';
EXCEPTION WHEN duplicate_object THEN NULL;
END $$`)
	if err != nil {
		t.Fatalf("create role keiro: %v", err)
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	name := "keiro_compose_" + hex.EncodeToString(b[:])
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name+" OWNER keiro"); err != nil {
		t.Fatalf("create database %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		c, err := pgx.Connect(ctx, testenv.DatabaseURL())
		if err != nil {
			t.Logf("drop database %s: %v", name, err)
			return
		}
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			t.Logf("drop database %s: %v", name, err)
		}
	})
	cc := admin.Config()
	u, err := url.Parse(testenv.DatabaseURL())
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	return &composeDB{name: name, host: cc.Host, hostport: net.JoinHostPort(cc.Host, strconv.Itoa(int(cc.Port))), url: u.String()}
}

// applyInitSQL runs the postgres service's /docker-entrypoint-initdb.d/*.sql on the test's
// database the way the image's initdb does: in name order, with psql as POSTGRES_USER,
// stopping at the first error.
func applyInitSQL(t *testing.T, p *types.Project, network validate.Network, db *composeDB) error {
	t.Helper()
	s := p.Services["postgres"]
	var dir string
	for _, v := range s.Volumes {
		if v.Type == types.VolumeTypeBind && v.Target == "/docker-entrypoint-initdb.d" {
			dir = v.Source
		}
	}
	if dir == "" {
		return errors.New(`service "postgres" mounts nothing on /docker-entrypoint-initdb.d`)
	}
	files, err := filepath.Glob(filepath.Join(dir, "*"))
	if err != nil {
		return err
	}
	slices.Sort(files)
	env, err := validate.ServiceEnv(p, "postgres")
	if err != nil {
		return err
	}
	host, port, _ := net.SplitHostPort(network.Rewrite("postgres:5432"))
	for _, f := range files {
		if !strings.HasSuffix(f, ".sql") {
			return fmt.Errorf("%s: the test applies only .sql init files", f)
		}
		cmd := exec.Command("psql", "-v", "ON_ERROR_STOP=1", "--no-psqlrc", "--quiet", "-f", f)
		cmd.Env = processEnv(map[string]string{
			"PGHOST": host, "PGPORT": port, "PGUSER": env["POSTGRES_USER"], "PGPASSWORD": env["POSTGRES_PASSWORD"], "PGDATABASE": db.name,
		})
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("initdb script %s: %v\n%s", f, err, out)
		}
	}
	return nil
}

// runDemoOrders runs the demo-orders service's entrypoint with its environment (N set to n),
// its bind mounts mapped onto their host paths.
func runDemoOrders(t *testing.T, p *types.Project, network validate.Network, dbName string, n int) error {
	t.Helper()
	const name = "demo-orders"
	env, err := validate.ServiceEnv(p, name)
	if err != nil {
		return err
	}
	for k, v := range env {
		env[k] = mapDatabase(k, network.Rewrite(v), dbName)
	}
	env["N"] = strconv.Itoa(n) // docker compose run -e N=…
	argv, err := validate.ServiceCommand(p, name)
	if err != nil {
		return err
	}
	for i := range argv {
		for _, v := range p.Services[name].Volumes {
			if v.Type == types.VolumeTypeBind {
				argv[i] = strings.ReplaceAll(argv[i], v.Target+"/", v.Source+"/")
			}
		}
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = processEnv(env)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %v: %v\n%s", name, argv, err, out)
	}
	t.Logf("%s:\n%s", name, out)
	return nil
}

// waitOrdersApplied waits until every row of the outbox (the demo's orders) is in the demo
// handler's table billing.orders_received.
func waitOrdersApplied(db *composeDB, consumer *proc) error {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, db.url)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	deadline := time.Now().Add(ordersWait)
	for {
		var total, missing int
		err := conn.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE r.message_id IS NULL)
FROM keiro.keiro_outbox o LEFT JOIN billing.orders_received r USING (message_id)`).Scan(&total, &missing)
		switch {
		case err != nil:
			return fmt.Errorf("count applied orders: %w", err)
		case total > 0 && missing == 0:
			return nil
		case consumer.exited():
			return fmt.Errorf("consumer exited with code %d before applying the orders:\n%s", consumer.exitCode(), tail(consumer.log(), 30))
		case time.Now().After(deadline):
			return fmt.Errorf("%d of %d orders not applied within %s:\n%s", missing, total, ordersWait, tail(consumer.log(), 30))
		}
		time.Sleep(100 * time.Millisecond) // polling another process's progress
	}
}

// otlpSink stands in for Jaeger's OTLP/HTTP receiver: it accepts every export and counts the
// trace exports.
type otlpSink struct {
	hostport string
	traces   atomic.Int64
	got      chan struct{}
	once     sync.Once
}

func newOTLPSink(t *testing.T) *otlpSink {
	s := &otlpSink{got: make(chan struct{})}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if r.Method == http.MethodPost && r.URL.Path == "/v1/traces" {
			s.traces.Add(1)
			s.once.Do(func() { close(s.got) })
		}
		// An empty protobuf message is a valid Export*ServiceResponse: everything accepted.
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(srv.Close)
	s.hostport = strings.TrimPrefix(srv.URL, "http://")
	return s
}

func (s *otlpSink) waitTraces(wait time.Duration) error {
	select {
	case <-s.got:
		return nil
	case <-time.After(wait):
		return fmt.Errorf("no OTLP trace export reached the jaeger endpoint within %s", wait)
	}
}

// Binaries: built once per test process, on first use.
var bins struct {
	once sync.Once
	dir  string
	err  error
}

// binary returns the path of the locally built cmd/<name>.
func binary(name string) (string, error) {
	bins.once.Do(func() {
		if bins.dir, bins.err = os.MkdirTemp("", "keiro-composecheck-bin-"); bins.err != nil {
			return
		}
		_, file, _, _ := runtime.Caller(0)
		cmd := exec.Command("go", "build", "-o", bins.dir+string(os.PathSeparator), "./cmd/relay", "./cmd/consumer")
		cmd.Dir = filepath.Join(filepath.Dir(file), "..", "..", "..")
		if out, err := cmd.CombinedOutput(); err != nil {
			bins.err = fmt.Errorf("build the binaries: %v\n%s", err, out)
		}
	})
	if bins.err != nil {
		return "", bins.err
	}
	p := filepath.Join(bins.dir, name)
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("no binary %s built from ./cmd", name)
	}
	return p, nil
}

// processEnv is the test process's environment without anything that configures the binaries
// or psql, plus env.
func processEnv(env map[string]string) []string {
	var out []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "KEIRO_") || strings.HasPrefix(kv, "OTEL_") || strings.HasPrefix(kv, "PG") {
			continue
		}
		out = append(out, kv)
	}
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	return out
}

// proc is a service's binary running as a child process.
type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited and its output is read
	addr chan string   // receives the HTTP address once logged

	mu   sync.Mutex
	out  strings.Builder
	code int
}

// startProc starts argv with env; the process is killed when t ends if it is still running.
func startProc(t *testing.T, name string, argv []string, env map[string]string, addrRe *regexp.Regexp) (*proc, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = processEnv(env)
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, done: make(chan struct{}), addr: make(chan string, 1)}
	scanned := make(chan struct{})
	go func() {
		defer close(scanned)
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		found := false
		for sc.Scan() {
			line := sc.Text()
			p.mu.Lock()
			p.out.WriteString(line + "\n")
			p.mu.Unlock()
			if m := addrRe.FindStringSubmatch(line); m != nil && !found {
				found = true
				p.addr <- m[1]
			}
		}
		_, _ = io.Copy(io.Discard, pr)
	}()
	go func() {
		err := cmd.Wait()
		_ = pw.Close()
		<-scanned
		p.mu.Lock()
		if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
			p.code = ee.ExitCode()
		} else if err != nil {
			p.code = -1
		}
		p.mu.Unlock()
		close(p.done)
	}()
	t.Cleanup(func() {
		// SIGTERM first, so that a consumer leaves its group and the group can be deleted.
		if _, err := p.stop(30 * time.Second); err != nil {
			_ = p.cmd.Process.Signal(syscall.SIGKILL)
			<-p.done
		}
		if t.Failed() {
			t.Logf("%s output:\n%s", name, tail(p.log(), 60))
		}
	})
	return p, nil
}

// waitAddr waits for the process to log its HTTP address.
func (p *proc) waitAddr(wait time.Duration) (string, error) {
	select {
	case a := <-p.addr:
		return a, nil
	case <-p.done:
		return "", fmt.Errorf("%s exited with code %d before serving HTTP:\n%s", p.name, p.exitCode(), tail(p.log(), 30))
	case <-time.After(wait):
		return "", fmt.Errorf("%s did not serve HTTP within %s:\n%s", p.name, wait, tail(p.log(), 30))
	}
}

// stop sends SIGTERM and waits up to grace (compose's stop_grace_period) for the exit code.
func (p *proc) stop(grace time.Duration) (int, error) {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return p.exitCode(), nil
	case <-time.After(grace):
		return -1, fmt.Errorf("%s did not exit within %s of SIGTERM (stop_grace_period):\n%s", p.name, grace, tail(p.log(), 30))
	}
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (p *proc) exitCode() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.code
}

func (p *proc) log() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func TestNetworkRewrite(t *testing.T) {
	n := validate.Network{
		"postgres:5432": "127.0.0.1:5432",
		"postgres":      "127.0.0.1",
		"kafka:9092":    "127.0.0.1:40001,127.0.0.1:40002",
		"jaeger:4318":   "127.0.0.1:40003",
	}
	for in, want := range map[string]string{
		"postgres://keiro:keiro@postgres:5432/keiro?sslmode=disable": "postgres://keiro:keiro@127.0.0.1:5432/keiro?sslmode=disable",
		"kafka:9092":                   "127.0.0.1:40001,127.0.0.1:40002",
		"PLAINTEXT://kafka:9092":       "PLAINTEXT://127.0.0.1:40001,127.0.0.1:40002",
		"kafka:9092,kafka:9092":        "127.0.0.1:40001,127.0.0.1:40002,127.0.0.1:40001,127.0.0.1:40002",
		"http://jaeger:4318/v1/traces": "http://127.0.0.1:40003/v1/traces",
		"postgres":                     "127.0.0.1",
		"postgres-replica:5432":        "postgres-replica:5432",
		"mykafka:9092":                 "mykafka:9092",
		"kafka:90921":                  "kafka:90921",
		"keiro-postgres":               "keiro-postgres",
		"billing.orders.v1":            "billing.orders.v1",
	} {
		if got := n.Rewrite(in); got != want {
			t.Errorf("Rewrite(%q) = %q, want %q", in, got, want)
		}
	}
}
