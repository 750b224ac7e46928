// Package kafkabroker runs a real Apache Kafka (KRaft) on loopback for tests: one combined
// broker and controller, or a cluster of brokers with a controller of their own whose nodes can
// be killed, stopped, paused and restarted. The broker comes from Maven artifacts (pom.xml:
// org.apache.kafka:kafka_2.13 and an SLF4J provider), resolved once per machine; it runs as a
// JVM child process that dies with the process that started it.
//
// Every guarantee the project makes about Kafka is shown against this broker; kfake stays for
// fast unit tests and fault injection.
package kafkabroker

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/keiro-go/keiro/internal/proc"
)

// Defaults of Config.
const (
	// DefaultSingleHeapMB bounds the heap of a one-node broker's JVM.
	DefaultSingleHeapMB = 768
	// DefaultClusterHeapMB bounds the heap of each JVM of a cluster (brokers and controller).
	DefaultClusterHeapMB = 384
	// DefaultStartTimeout bounds the wait for a node to answer after it was started.
	DefaultStartTimeout = 2 * time.Minute
)

// DefaultJVMOptions are the JVM's memory and collector options unless Config.JVMOptions
// replaces them: a small initial heap and the serial collector, the least memory and CPU for a
// test suite, at the price of stop-the-world young collections of tens of milliseconds under
// load.
var DefaultJVMOptions = []string{"-Xms128m", "-XX:+UseSerialGC"}

// KafkaJVMOptions are the options Apache Kafka's own start scripts give a broker
// (kafka-server-start.sh's KAFKA_HEAP_OPTS and kafka-run-class.sh's
// KAFKA_JVM_PERFORMANCE_OPTS): a 1 GiB heap and the G1 collector aiming at pauses under 20
// ms, what a production broker runs. Config.HeapMB's -Xmx comes after them and bounds the heap.
var KafkaJVMOptions = []string{"-Xms1g", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
	"-XX:InitiatingHeapOccupancyPercent=35", "-XX:+ExplicitGCInvokesConcurrent"}

// Config configures Start.
type Config struct {
	// Brokers is the number of brokers. 1 runs one process that is broker and controller;
	// more run that many brokers and one controller process of their own, so that brokers can
	// be killed without losing the metadata quorum. Defaults to 1.
	Brokers int
	// Dir holds each node's data, configuration and log (<Dir>/node-<id>/server.log). Defaults
	// to a new temporary directory, removed by Close.
	Dir string
	// HeapMB is the maximum heap of each JVM. Defaults to DefaultSingleHeapMB for one broker
	// and DefaultClusterHeapMB per JVM for a cluster.
	HeapMB int
	// JVMOptions replace DefaultJVMOptions, the JVM's initial heap and collector options (for
	// example KafkaJVMOptions). Defaults to DefaultJVMOptions.
	JVMOptions []string
	// Props are server properties set on every node after the package's own (see
	// baseProps), for example "auto.create.topics.enable": "false". Defaults to none.
	Props map[string]string
	// StartTimeout bounds the wait for the cluster, or a restarted node, to answer. Defaults
	// to DefaultStartTimeout.
	StartTimeout time.Duration
	// Advertise, if set, gives every broker a second client listener, EXTERNAL, on a loopback
	// port of its own, advertised at the address Advertise returns for the broker's node id
	// and that listener's address: typically a proxy in front of it
	// (keirotest/testenv/netproxy). Kafka answers metadata with the addresses of the listener
	// the request came in on, so a client seeded with the advertised addresses
	// (Cluster.AdvertisedSeeds) reaches every broker through them, while Node.Addr, the
	// brokers' own listener, stays direct. Defaults to nil: one client listener.
	Advertise func(id int32, external string) (advertised string, err error)
}

// applyJVMDefaults sets JVMOptions to DefaultJVMOptions if none are given.
func (c *Config) applyJVMDefaults() {
	if len(c.JVMOptions) == 0 {
		c.JVMOptions = DefaultJVMOptions
	}
}

// Cluster is a running Kafka cluster on loopback.
type Cluster struct {
	// Brokers are the broker nodes, in node id order (ids 1..n).
	Brokers []*Node
	// Controller is the controller of a multi-broker cluster (node id 100); nil for one
	// broker, which is its own controller.
	Controller *Node

	cfg     Config
	rmDir   bool
	closing sync.Once
}

// Node is one Kafka process of a Cluster.
type Node struct {
	// ID is the node id (node.id).
	ID int32
	// Addr is the client listener (host:port); empty for the controller.
	Addr string
	// External is the EXTERNAL listener of Config.Advertise and Advertised the address it is
	// advertised at; both empty without Advertise.
	External, Advertised string

	dir       string
	classpath string
	heapMB    int
	jvmOpts   []string
	timeout   time.Duration
	isBroker  bool

	mu   sync.Mutex
	proc *process
}

// Start formats storage for every node, starts them and waits until the cluster answers
// metadata with every broker and can create a topic. Close stops it.
func Start(ctx context.Context, cfg Config) (*Cluster, error) {
	if cfg.Brokers == 0 {
		cfg.Brokers = 1
	}
	if cfg.Brokers < 0 || cfg.Brokers > 9 {
		return nil, fmt.Errorf("kafkabroker: Config.Brokers must be 1..9, got %d", cfg.Brokers)
	}
	if cfg.HeapMB == 0 {
		cfg.HeapMB = DefaultSingleHeapMB
		if cfg.Brokers > 1 {
			cfg.HeapMB = DefaultClusterHeapMB
		}
	}
	if cfg.StartTimeout == 0 {
		cfg.StartTimeout = DefaultStartTimeout
	}
	cfg.applyJVMDefaults()
	if _, err := exec.LookPath("java"); err != nil {
		return nil, errors.New("kafkabroker: java not found: the real Kafka broker needs Java 17 " +
			"(e.g. Debian's openjdk-17-jre-headless), or point the tests at a running broker with KEIRO_TEST_KAFKA_BROKERS=host:port")
	}
	cp, err := Classpath(ctx)
	if err != nil {
		return nil, fmt.Errorf("kafkabroker: %w", err)
	}
	c := &Cluster{cfg: cfg}
	if cfg.Dir == "" {
		if c.cfg.Dir, err = os.MkdirTemp("", "keiro-kafka-"); err != nil {
			return nil, fmt.Errorf("kafkabroker: create the data directory: %w", err)
		}
		c.rmDir = true
	}
	ok := false
	defer func() {
		if !ok {
			c.Close()
		}
	}()

	nports := 2*cfg.Brokers + 1
	if cfg.Advertise != nil {
		nports += cfg.Brokers
	}
	ports, err := freePorts(nports)
	if err != nil {
		return nil, err
	}
	external := ports[2*cfg.Brokers+1:]
	// advertise sets the EXTERNAL listener of broker n (the i-th) with Config.Advertise.
	advertise := func(n *Node, i int) error {
		if cfg.Advertise == nil {
			return nil
		}
		n.External = addr(external[i])
		adv, err := cfg.Advertise(n.ID, n.External)
		if err != nil {
			return fmt.Errorf("kafkabroker: advertise broker %d: %w", n.ID, err)
		}
		n.Advertised = adv
		return nil
	}
	newNode := func(id int32, isBroker bool) *Node {
		return &Node{ID: id, dir: filepath.Join(c.cfg.Dir, fmt.Sprintf("node-%d", id)), classpath: cp,
			heapMB: cfg.HeapMB, jvmOpts: cfg.JVMOptions, timeout: cfg.StartTimeout, isBroker: isBroker}
	}
	var voters string
	if cfg.Brokers == 1 {
		n := newNode(1, true)
		n.Addr = addr(ports[0])
		if err := advertise(n, 0); err != nil {
			return nil, err
		}
		voters = fmt.Sprintf("1@%s", addr(ports[1]))
		if err := n.configure(baseProps(cfg, n, voters, "broker,controller", addr(ports[1]))); err != nil {
			return nil, err
		}
		c.Brokers = []*Node{n}
	} else {
		ctrl := newNode(100, false)
		voters = fmt.Sprintf("100@%s", addr(ports[0]))
		if err := ctrl.configure(baseProps(cfg, ctrl, voters, "controller", addr(ports[0]))); err != nil {
			return nil, err
		}
		c.Controller = ctrl
		for i := 1; i <= cfg.Brokers; i++ {
			n := newNode(int32(i), true)
			n.Addr = addr(ports[i])
			if err := advertise(n, i-1); err != nil {
				return nil, err
			}
			if err := n.configure(baseProps(cfg, n, voters, "broker", "")); err != nil {
				return nil, err
			}
			c.Brokers = append(c.Brokers, n)
		}
	}

	clusterID, err := newClusterID()
	if err != nil {
		return nil, err
	}
	nodes := c.nodes()
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = n.format(ctx, clusterID)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	for _, n := range nodes {
		if err := n.launch(); err != nil {
			return nil, err
		}
	}
	if err := c.WaitReady(ctx); err != nil {
		return nil, err
	}
	ok = true
	return c, nil
}

// Seeds returns the brokers' client addresses.
func (c *Cluster) Seeds() []string {
	out := make([]string, len(c.Brokers))
	for i, n := range c.Brokers {
		out[i] = n.Addr
	}
	return out
}

// AdvertisedSeeds returns the brokers' advertised EXTERNAL addresses (Config.Advertise), or
// nil without Advertise.
func (c *Cluster) AdvertisedSeeds() []string {
	if c.cfg.Advertise == nil {
		return nil
	}
	out := make([]string, len(c.Brokers))
	for i, n := range c.Brokers {
		out[i] = n.Advertised
	}
	return out
}

// Broker returns the broker with node id id, or nil.
func (c *Cluster) Broker(id int32) *Node {
	for _, n := range c.Brokers {
		if n.ID == id {
			return n
		}
	}
	return nil
}

// WaitReady waits until every running broker is in the cluster's metadata and a topic can be
// created with the cluster's replication factor.
func (c *Cluster) WaitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.StartTimeout)
	defer cancel()
	var running []*Node
	for _, n := range c.Brokers {
		if n.Running() {
			running = append(running, n)
		}
	}
	if len(running) == 0 {
		return errors.New("kafkabroker: no broker is running")
	}
	seeds := make([]string, len(running))
	for i, n := range running {
		seeds[i] = n.Addr
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.RetryTimeout(time.Second),
		kgo.RetryBackoffFn(func(int) time.Duration { return 100 * time.Millisecond }))
	if err != nil {
		return fmt.Errorf("kafkabroker: %w", err)
	}
	defer cl.Close()
	rf := int16(min(len(running), 3))
	var last error
	for {
		if err := c.exited(); err != nil {
			return err
		}
		last = probe(ctx, cl, len(running), rf)
		if last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("kafkabroker: the cluster did not answer within %s: %w\n%s", c.cfg.StartTimeout, last, c.logs())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// probe asks for metadata and creates (or finds) the readiness topic.
func probe(ctx context.Context, cl *kgo.Client, brokers int, rf int16) error {
	adm := kadm.NewClient(cl)
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	ids, err := brokerIDs(pctx, cl)
	if err != nil {
		return fmt.Errorf("metadata: %w", err)
	}
	if len(ids) < brokers {
		return fmt.Errorf("metadata lists %d of %d brokers", len(ids), brokers)
	}
	resp, err := adm.CreateTopic(pctx, 1, rf, nil, "__keiro_ready")
	if err == nil {
		err = resp.Err
	}
	if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
		return fmt.Errorf("create a topic: %w", err)
	}
	return nil
}

// brokerIDs asks a broker for the cluster's brokers, past the client's metadata cache.
func brokerIDs(ctx context.Context, cl *kgo.Client) ([]int32, error) {
	req := kmsg.NewPtrMetadataRequest()
	req.Topics = []kmsg.MetadataRequestTopic{}
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return nil, err
	}
	ids := make([]int32, len(resp.Brokers))
	for i, b := range resp.Brokers {
		ids[i] = b.NodeID
	}
	return ids, nil
}

// exited returns an error naming a broker or controller that should run but exited.
func (c *Cluster) exited() error {
	for _, n := range c.nodes() {
		n.mu.Lock()
		p := n.proc
		n.mu.Unlock()
		if p == nil {
			continue
		}
		if p.Exited() {
			return fmt.Errorf("kafkabroker: node %d exited: %w\n%s", n.ID, p.Err(), n.logTail(30))
		}
	}
	return nil
}

// logs returns the end of every node's log.
func (c *Cluster) logs() string {
	var b strings.Builder
	for _, n := range c.nodes() {
		fmt.Fprintf(&b, "--- node %d (%s) ---\n%s\n", n.ID, n.LogPath(), n.logTail(20))
	}
	return b.String()
}

// Close kills every node and removes the data directory when Start made it. Safe to call
// more than once.
func (c *Cluster) Close() {
	c.closing.Do(func() {
		for _, n := range c.nodes() {
			_ = n.Kill()
		}
		if c.rmDir && os.Getenv("KEIRO_KAFKA_KEEP") == "" {
			_ = os.RemoveAll(c.cfg.Dir)
		}
	})
}

func (c *Cluster) nodes() []*Node {
	out := append([]*Node(nil), c.Brokers...)
	if c.Controller != nil {
		out = append(out, c.Controller)
	}
	return out
}

// baseProps returns a node's server properties: loopback listeners, replication suited to the
// cluster's size, and a group coordinator that does not wait for members to trickle in
// (group.initial.rebalance.delay.ms=0: a test's group forms at once; production keeps 3 s).
func baseProps(cfg Config, n *Node, voters, roles, ctrlAddr string) map[string]string {
	rf := strconv.Itoa(min(cfg.Brokers, 3))
	minISR := "1"
	if cfg.Brokers >= 3 {
		minISR = "2"
	}
	p := map[string]string{
		"process.roles":                            roles,
		"node.id":                                  strconv.Itoa(int(n.ID)),
		"controller.quorum.voters":                 voters,
		"controller.listener.names":                "CONTROLLER",
		"listener.security.protocol.map":           "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
		"log.dirs":                                 filepath.Join(n.dir, "data"),
		"num.partitions":                           "1",
		"default.replication.factor":               rf,
		"min.insync.replicas":                      minISR,
		"offsets.topic.replication.factor":         rf,
		"offsets.topic.num.partitions":             "10",
		"transaction.state.log.replication.factor": rf,
		"transaction.state.log.min.isr":            minISR,
		"transaction.state.log.num.partitions":     "4",
		// A transaction's first produce to a partition waits, on the broker, until the
		// coordinator has finished the producer's previous transaction, retrying every
		// add.partitions.to.txn.retry.backoff.ms (20 by default): about 20ms on every
		// transaction of a relay that commits back to back (docs/operations.md,
		// "Exactly-once publication").
		"add.partitions.to.txn.retry.backoff.ms":           "1",
		"share.coordinator.state.topic.replication.factor": rf,
		"share.coordinator.state.topic.min.isr":            minISR,
		"group.initial.rebalance.delay.ms":                 "0",
		"auto.create.topics.enable":                        "true",
		"unclean.leader.election.enable":                   "false",
	}
	switch {
	case roles == "controller":
		p["listeners"] = "CONTROLLER://" + ctrlAddr
	case ctrlAddr != "":
		p["listeners"] = "PLAINTEXT://" + n.Addr + ",CONTROLLER://" + ctrlAddr
		p["advertised.listeners"] = "PLAINTEXT://" + n.Addr
		p["inter.broker.listener.name"] = "PLAINTEXT"
	default:
		p["listeners"] = "PLAINTEXT://" + n.Addr
		p["advertised.listeners"] = "PLAINTEXT://" + n.Addr
		p["inter.broker.listener.name"] = "PLAINTEXT"
	}
	if n.External != "" {
		p["listener.security.protocol.map"] += ",EXTERNAL:PLAINTEXT"
		p["listeners"] += ",EXTERNAL://" + n.External
		p["advertised.listeners"] += ",EXTERNAL://" + n.Advertised
	}
	for k, v := range cfg.Props {
		p[k] = v
	}
	return p
}

const log4j2 = `status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = warn
rootLogger.appenderRef.out.ref = out
logger.server.name = kafka.server.KafkaRaftServer
logger.server.level = info
logger.broker.name = kafka.server.BrokerServer
logger.broker.level = info
`

// configure writes the node's server.properties and logging configuration.
func (n *Node) configure(props map[string]string) error {
	if err := os.MkdirAll(filepath.Join(n.dir, "data"), 0o755); err != nil {
		return fmt.Errorf("kafkabroker: create %s: %w", n.dir, err)
	}
	keys := make([]string, 0, len(props))
	for k := range props {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%s=%s\n", k, props[k])
	}
	if err := os.WriteFile(n.propsPath(), []byte(b.String()), 0o644); err != nil {
		return fmt.Errorf("kafkabroker: write server.properties: %w", err)
	}
	if err := os.WriteFile(filepath.Join(n.dir, "log4j2.properties"), []byte(log4j2), 0o644); err != nil {
		return fmt.Errorf("kafkabroker: write log4j2.properties: %w", err)
	}
	return nil
}

func (n *Node) propsPath() string { return filepath.Join(n.dir, "server.properties") }

// LogPath is the file the node's JVM writes its output to.
func (n *Node) LogPath() string { return filepath.Join(n.dir, "server.log") }

func (n *Node) jvmArgs(main string, args ...string) []string {
	out := append(slices.Clone(n.jvmOpts), fmt.Sprintf("-Xmx%dm", n.heapMB),
		"-Djava.awt.headless=true",
		"-Dlog4j2.configurationFile="+filepath.Join(n.dir, "log4j2.properties"),
		"-cp", n.classpath, main)
	return append(out, args...)
}

// format runs the storage tool for the node.
func (n *Node) format(ctx context.Context, clusterID string) error {
	cmd := exec.CommandContext(ctx, "java", n.jvmArgs("kafka.tools.StorageTool",
		"format", "--ignore-formatted", "-t", clusterID, "-c", n.propsPath())...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("kafkabroker: format node %d: %w\n%s", n.ID, err, tail(string(out), 30))
	}
	return nil
}

// launch starts the node's JVM.
func (n *Node) launch() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.proc != nil && !n.proc.Exited() {
		return fmt.Errorf("kafkabroker: node %d is already running", n.ID)
	}
	p, err := startProcess(n.LogPath(), "java", n.jvmArgs("kafka.Kafka", n.propsPath()))
	if err != nil {
		return fmt.Errorf("kafkabroker: start node %d: %w", n.ID, err)
	}
	n.proc = p
	return nil
}

// Running reports whether the node's process is alive (a paused one is).
func (n *Node) Running() bool {
	n.mu.Lock()
	p := n.proc
	n.mu.Unlock()
	return p != nil && !p.Exited()
}

// Pid returns the process id of the node's JVM, or 0 when it was never started (a benchmark
// reads the broker's CPU time from /proc with it).
func (n *Node) Pid() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.proc == nil || n.proc.Cmd == nil {
		return 0
	}
	return n.proc.Cmd.Process.Pid
}

// Kill sends SIGKILL and waits for the process to exit. A node that is not running is left
// alone.
func (n *Node) Kill() error { return n.signalWait(syscall.SIGKILL, time.Minute) }

// Stop sends SIGTERM (Kafka's controlled shutdown: leadership moves away first) and waits up
// to timeout for the exit; a node still running then is killed.
func (n *Node) Stop(timeout time.Duration) error {
	if err := n.signalWait(syscall.SIGTERM, timeout); err != nil {
		_ = n.Kill()
		return err
	}
	return nil
}

// Pause sends SIGSTOP: the process keeps its sockets but answers nothing, as a broker in a
// long GC pause or a frozen VM does.
func (n *Node) Pause() error { return n.signal(syscall.SIGSTOP) }

// Resume sends SIGCONT to a paused node.
func (n *Node) Resume() error { return n.signal(syscall.SIGCONT) }

// Restart starts a node that was killed or stopped again, on the same ports and data, and
// waits until it answers metadata.
func (n *Node) Restart(ctx context.Context) error {
	if n.Running() {
		return fmt.Errorf("kafkabroker: node %d is running; kill or stop it first", n.ID)
	}
	if err := n.launch(); err != nil {
		return err
	}
	if !n.isBroker {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, n.timeout)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(n.Addr))
	if err != nil {
		return err
	}
	defer cl.Close()
	for {
		pctx, pcancel := context.WithTimeout(ctx, 3*time.Second)
		ids, err := brokerIDs(pctx, cl)
		pcancel()
		if err == nil && slices.Contains(ids, n.ID) {
			return nil
		}
		if !n.Running() {
			return fmt.Errorf("kafkabroker: node %d exited after its restart:\n%s", n.ID, n.logTail(30))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("kafkabroker: node %d did not answer within %s after its restart: %w\n%s", n.ID, n.timeout, err, n.logTail(30))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (n *Node) signal(sig syscall.Signal) error {
	n.mu.Lock()
	p := n.proc
	n.mu.Unlock()
	if p == nil {
		return fmt.Errorf("kafkabroker: node %d was never started", n.ID)
	}
	if err := p.Signal(sig); err != nil {
		return fmt.Errorf("kafkabroker: signal node %d: %w", n.ID, err)
	}
	return nil
}

func (n *Node) signalWait(sig syscall.Signal, timeout time.Duration) error {
	n.mu.Lock()
	p := n.proc
	n.mu.Unlock()
	if p == nil {
		return nil
	}
	if p.Exited() {
		return nil
	}
	if sig != syscall.SIGKILL {
		_ = p.Signal(syscall.SIGCONT) // a paused JVM cannot shut down
	}
	if err := p.Signal(sig); err != nil {
		return fmt.Errorf("kafkabroker: signal node %d: %w", n.ID, err)
	}
	select {
	case <-p.Done():
		return nil
	case <-time.After(timeout):
		return fmt.Errorf("kafkabroker: node %d did not exit within %s of %v", n.ID, timeout, sig)
	}
}

func (n *Node) logTail(lines int) string {
	b, err := os.ReadFile(n.LogPath())
	if err != nil {
		return ""
	}
	return tail(string(b), lines)
}

// process is a node's JVM (package proc: it dies with the process that started it).
type process = proc.Process

func startProcess(logPath, name string, args []string) (*process, error) {
	return proc.Start(logPath, "", name, args)
}

// freePorts returns n distinct free loopback ports.
func freePorts(n int) ([]int, error) {
	ports, err := proc.FreePorts(n)
	if err != nil {
		return nil, fmt.Errorf("kafkabroker: %w", err)
	}
	return ports, nil
}

func addr(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }

// newClusterID returns a random Kafka cluster id (a UUID in Kafka's base64 form).
func newClusterID() (string, error) {
	for {
		var b [16]byte
		if _, err := rand.Read(b[:]); err != nil {
			return "", fmt.Errorf("kafkabroker: cluster id: %w", err)
		}
		b[6] = b[6]&0x0f | 0x40
		b[8] = b[8]&0x3f | 0x80
		if id := base64.RawURLEncoding.EncodeToString(b[:]); id[0] != '-' { // a leading '-' reads as a flag
			return id, nil
		}
	}
}
