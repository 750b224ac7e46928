package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keiro-go/keiro/cmd/internal/cli"
	"github.com/keiro-go/keiro/cmd/internal/kafkaconfig"
	"github.com/keiro-go/keiro/console"
	"github.com/keiro-go/keiro/inbox"
	"github.com/keiro-go/keiro/migrations"
)

// lagTimeout bounds the look-up of the group's lag.
const lagTimeout = 10 * time.Second

// statusCmd prints the schema version, the inbox's failed rows per consumer name, and, with
// --brokers and --group, the group's lag from Kafka.
type statusCmd struct {
	ID      identityFlags `embed:""`
	Brokers []string      `help:"Kafka seed brokers, host:port, comma separated: with --group, the group's lag is read from Kafka." placeholder:"HOST:PORT"`
	// TLS and SASL are the run command's, so the lag of a managed cluster can be read.
	TLS  kafkaconfig.TLS  `embed:"" prefix:"kafka-tls-"`
	SASL kafkaconfig.SASL `embed:"" prefix:"kafka-sasl-"`
	JSON bool             `name:"json" help:"Print JSON instead of text."`
	// AdminURL and AdminTokenFile reach a running consumer's admin API for its partitions.
	AdminURL       string `name:"admin-url" help:"Base URL of a running consumer's HTTP server (its --http-addr, e.g. http://127.0.0.1:9478): the partitions it owns are shown with the record in flight, the age of the oldest waiting record, the time since the last commit and a stuck-since flag." placeholder:"URL"`
	AdminTokenFile string `name:"admin-token-file" env:"-" help:"File holding the admin token of --admin-url (trailing newline trimmed); not needed on loopback." placeholder:"FILE"`
}

// consumerCounts are one inbox consumer name's rows by state.
type consumerCounts struct {
	Completed int64 `json:"completed"`
	// Retrying counts failed rows that a redelivery runs again (attempts left).
	Retrying int64 `json:"retrying"`
	// Poisoned counts failed rows past their attempt ceiling (dead-lettered).
	Poisoned int64 `json:"poisoned"`
	// Archived counts failed rows an operator set aside (inbox archive): in neither count above.
	Archived int64 `json:"archived"`
}

// groupLag is a consumer group's lag as Kafka reports it.
type groupLag struct {
	Group string `json:"group"`
	State string `json:"state"`
	// Total is the sum of the partitions' lag (end offset minus committed offset).
	Total int64 `json:"total"`
	// Topics maps each topic to its partitions' lag.
	Topics map[string]map[int32]int64 `json:"topics"`
}

// inboxStatus is what `consumer status` reports.
type inboxStatus struct {
	Schema        string `json:"schema"`
	SchemaVersion int32  `json:"schema_version"`
	LatestVersion int32  `json:"latest_version"`
	// Consumers maps each inbox consumer name (all of them, or --name/--group's) to its rows.
	Consumers map[string]consumerCounts `json:"consumers"`
	// Lag is the group's lag; null without --brokers and --group.
	Lag *groupLag `json:"lag"`
	// LagError says why the lag could not be read.
	LagError string `json:"lag_error,omitempty"`
	// Partitions are the running consumer's partitions (with --admin-url), as its admin API
	// answers GET /api/v1/consumer/lag; null without --admin-url.
	Partitions *console.ConsumerLag `json:"partitions,omitempty"`
	// PartitionsError says why the running consumer could not be asked.
	PartitionsError string `json:"partitions_error,omitempty"`
}

// ValidateFlags checks the Kafka connection flags the lag is read with: with --brokers, every
// problem the run command would report (a certificate without its key, SASL without
// credentials, …); without it, TLS or SASL flags have nothing to apply to.
func (c *statusCmd) ValidateFlags() error {
	if len(c.Brokers) == 0 {
		if c.TLS.Enabled || c.SASL.Mechanism != "" {
			var p cli.Problems
			p.Add("brokers", "is required with the Kafka TLS or SASL flags: they only apply to reading the lag")
			return errors.Join(p.Err(), c.validateAdmin())
		}
		return c.validateAdmin()
	}
	kc := kafkaconfig.Config{Brokers: c.Brokers, TLS: c.TLS, SASL: c.SASL}
	return errors.Join(kc.ValidateFlags(), c.validateAdmin())
}

// validateAdmin checks --admin-url and --admin-token-file.
func (c *statusCmd) validateAdmin() error {
	var p cli.Problems
	if c.AdminURL != "" {
		u, err := url.Parse(c.AdminURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			p.Add("admin-url", "%q is not an http:// or https:// URL with a host (the consumer's --http-addr, e.g. http://127.0.0.1:9478)", c.AdminURL)
		}
	} else if c.AdminTokenFile != "" {
		p.Add("admin-token-file", "only applies with --admin-url")
	}
	af := cli.AdminFlags{AdminTokenFile: c.AdminTokenFile}
	if _, err := af.Token(); err != nil {
		p.AddErr("admin-token-file", err)
	}
	return p.Err()
}

// Run prints the status. It fails (exit 1) when migrations are pending, so that it can serve
// as a deployment check, and when the lag was asked for and could not be read.
func (c *statusCmd) Run(ctx context.Context, env *cli.Env, g *grammar) error {
	conn, err := g.DB.Connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	mst, err := migrations.GetStatus(ctx, conn, g.DB.Schema)
	if err != nil {
		return err
	}
	st := inboxStatus{Schema: mst.Schema, SchemaVersion: mst.Current, LatestVersion: mst.Latest, Consumers: map[string]consumerCounts{}}
	if mst.Pending() {
		c.print(env, st)
		return &cli.ExitError{Code: cli.ExitFailure, Err: fmt.Errorf("migrations pending: run `consumer migrate`")}
	}
	if err := readConsumerCounts(ctx, conn, g.DB.Schema, c.ID.consumerName(), st.Consumers); err != nil {
		return err
	}
	if len(c.Brokers) > 0 && c.ID.Group != "" {
		st.Lag, err = readLag(ctx, kafkaconfig.Config{Brokers: c.Brokers, ClientID: clientID, TLS: c.TLS, SASL: c.SASL}, c.ID.Group)
		if err != nil {
			st.LagError = err.Error()
		}
	}
	if c.AdminURL != "" {
		st.Partitions, err = c.readPartitions(ctx)
		if err != nil {
			st.PartitionsError = err.Error()
		}
	}
	c.print(env, st)
	if st.PartitionsError != "" {
		return &cli.ExitError{Code: cli.ExitFailure, Err: fmt.Errorf("ask the running consumer at %s: %s", c.AdminURL, st.PartitionsError)}
	}
	if st.LagError != "" {
		return &cli.ExitError{Code: cli.ExitFailure, Err: fmt.Errorf("read the lag of group %s: %s", c.ID.Group, st.LagError)}
	}
	return nil
}

// readConsumerCounts fills into with the inbox's row counts of every consumer name, or of
// name alone (zero counts when it has no rows), as inbox.Admin.CountByConsumer reads them.
func readConsumerCounts(ctx context.Context, conn *pgx.Conn, schema, name string, into map[string]consumerCounts) error {
	// CountByConsumer reads every consumer's rows whatever its store is named; the name
	// only has to be a valid one.
	storeName := name
	if storeName == "" {
		storeName = "consumer status"
	}
	store, err := inbox.NewStore(inbox.StoreConfig{Schema: schema, Consumer: storeName})
	if err != nil {
		return err
	}
	counts, err := inbox.NewAdmin(store).CountByConsumer(ctx, conn)
	if err != nil {
		return err
	}
	for _, cc := range counts {
		if name == "" || cc.Consumer == name {
			into[cc.Consumer] = consumerCounts{Completed: cc.Completed, Retrying: cc.Retrying, Poisoned: cc.Poisoned, Archived: cc.Archived}
		}
	}
	if _, ok := into[name]; name != "" && !ok {
		into[name] = consumerCounts{}
	}
	return nil
}

// readLag asks Kafka for group's lag (end offsets minus committed offsets), connecting with the
// same TLS and SASL settings as the run command.
func readLag(ctx context.Context, kc kafkaconfig.Config, group string) (*groupLag, error) {
	opts, err := kc.Opts()
	if err != nil {
		return nil, err
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, lagTimeout)
	defer cancel()
	l, err := inbox.GroupLag(ctx, cl, group)
	if err != nil {
		return nil, err
	}
	out := &groupLag{Group: group, State: l.State, Total: l.Lag.Total(), Topics: map[string]map[int32]int64{}}
	for t, ps := range l.Lag {
		out.Topics[t] = map[int32]int64{}
		for p, ml := range ps {
			out.Topics[t][p] = ml.Lag
		}
	}
	return out, nil
}

// readPartitions asks the running consumer's admin API for its lag and partitions.
func (c *statusCmd) readPartitions(ctx context.Context) (*console.ConsumerLag, error) {
	af := cli.AdminFlags{AdminTokenFile: c.AdminTokenFile}
	token, err := af.Token()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, lagTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(c.AdminURL, "/")+"/api/v1/consumer/lag", nil)
	if err != nil {
		return nil, err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%w (is the consumer running with --http-addr?)", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Error string `json:"error"`
		}
		if json.Unmarshal(body, &e) == nil && e.Error != "" {
			return nil, fmt.Errorf("%s: %s", resp.Status, e.Error)
		}
		return nil, fmt.Errorf("%s (is %s a consumer's HTTP address?)", resp.Status, c.AdminURL)
	}
	var l console.ConsumerLag
	if err := json.Unmarshal(body, &l); err != nil {
		return nil, fmt.Errorf("read the answer: %w", err)
	}
	return &l, nil
}

// printPartitions prints the running consumer's partitions, one line each.
func printPartitions(w io.Writer, l *console.ConsumerLag) {
	fmt.Fprintf(w, "\nrunning consumer, group %s: %d partition(s), %d stuck (no move for %s while records wait)\n",
		l.Group, len(l.Partitions), l.Stuck, time.Duration(l.StuckAfterSeconds*float64(time.Second)))
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TOPIC\tPARTITION\tLAG\tIN FLIGHT\tOLDEST WAITING\tLAST COMMIT\tSTATE")
	secs := func(s *float64, none string) string {
		if s == nil {
			return none
		}
		return time.Duration(*s * float64(time.Second)).Round(time.Second).String()
	}
	for _, p := range l.Partitions {
		lag := "-"
		if p.Lag >= 0 {
			lag = fmt.Sprint(p.Lag)
		}
		pr := p.Progress
		if pr == nil {
			fmt.Fprintf(tw, "%s\t%d\t%s\t-\t-\t-\tnot owned by this member\n", p.Topic, p.Partition, lag)
			continue
		}
		inFlight := "-"
		if pr.InFlight != nil {
			inFlight = fmt.Sprintf("%d for %s", *pr.InFlight, secs(pr.InFlightSeconds, "?"))
		}
		state := "idle"
		switch {
		case pr.DeadLetterBlockedSince != nil:
			state = "WAITING ON THE DEAD-LETTER TOPIC since " + pr.DeadLetterBlockedSince.UTC().Format(time.RFC3339) + ": " + pr.DeadLetterError
		case pr.StuckSince != nil:
			state = "STUCK since " + pr.StuckSince.UTC().Format(time.RFC3339)
		case pr.Waiting > 0:
			state = "moving"
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\n", p.Topic, p.Partition, lag, inFlight,
			secs(pr.OldestWaitingAgeSeconds, "-"), secs(pr.LastCommitAgeSeconds, "none yet"), state)
	}
	_ = tw.Flush()
}

func (c *statusCmd) print(env *cli.Env, st inboxStatus) {
	if c.JSON {
		enc := json.NewEncoder(env.Stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(st)
		return
	}
	w := env.Stdout
	fmt.Fprintf(w, "schema %s at version %d of %d\n", st.Schema, st.SchemaVersion, st.LatestVersion)
	if len(st.Consumers) > 0 {
		names := make([]string, 0, len(st.Consumers))
		for n := range st.Consumers {
			names = append(names, n)
		}
		sort.Strings(names)
		fmt.Fprintln(w)
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "CONSUMER\tCOMPLETED\tRETRYING\tPOISONED\tARCHIVED\t")
		for _, n := range names {
			cc := st.Consumers[n]
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t\n", n, cc.Completed, cc.Retrying, cc.Poisoned, cc.Archived)
		}
		_ = tw.Flush()
		for _, n := range names {
			if cc := st.Consumers[n]; cc.Retrying+cc.Poisoned > 0 {
				fmt.Fprintf(w, "consumer %s: %d failed rows (%d retrying, %d poisoned; see `consumer inbox failed list --name %s`)\n",
					n, cc.Retrying+cc.Poisoned, cc.Retrying, cc.Poisoned, n)
			}
		}
	}
	if st.Lag != nil {
		var parts []string
		topics := make([]string, 0, len(st.Lag.Topics))
		for t := range st.Lag.Topics {
			topics = append(topics, t)
		}
		sort.Strings(topics)
		for _, t := range topics {
			var sum int64
			for _, v := range st.Lag.Topics[t] {
				sum += v
			}
			parts = append(parts, fmt.Sprintf("%s=%d", t, sum))
		}
		fmt.Fprintf(w, "\ngroup %s (%s): lag %d (%s)\n", st.Lag.Group, st.Lag.State, st.Lag.Total, strings.Join(parts, ", "))
	}
	if st.Partitions != nil {
		printPartitions(w, st.Partitions)
	}
}
