package validate

import (
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/compose-spec/compose-go/v2/types"

	"github.com/keiro-go/keiro/inbox"
)

// TopicInitService is the compose service that creates the stack's Kafka topics from its
// TOPICS variable ("name:partitions …"); the broker does not create topics on first use.
const TopicInitService = "kafka-init"

// Topic is one topic the stack creates.
type Topic struct {
	// Name is the topic's name.
	Name string
	// Partitions is its partition count.
	Partitions int32
}

// InitTopics returns the topics [TopicInitService] creates, in the order TOPICS lists them.
func InitTopics(p *types.Project) ([]Topic, error) {
	s, ok := p.Services[TopicInitService]
	if !ok {
		return nil, fmt.Errorf("no %s service", TopicInitService)
	}
	v := s.Environment["TOPICS"]
	if v == nil || strings.TrimSpace(*v) == "" {
		return nil, fmt.Errorf("service %q: TOPICS is not set", TopicInitService)
	}
	var topics []Topic
	for _, spec := range strings.Fields(*v) {
		name, parts, ok := strings.Cut(spec, ":")
		n, err := strconv.ParseInt(parts, 10, 32)
		if !ok || name == "" || err != nil || n < 1 {
			return nil, fmt.Errorf("service %q: TOPICS entry %q is not name:partitions", TopicInitService, spec)
		}
		topics = append(topics, Topic{Name: name, Partitions: int32(n)})
	}
	return topics, nil
}

// ServiceImage returns the Dockerfile [Image] a service is built into (its build target), or
// ok=false for a service run from a published image.
func ServiceImage(p *types.Project, service string) (img Image, ok bool, err error) {
	s, found := p.Services[service]
	if !found {
		return Image{}, false, fmt.Errorf("no service %q", service)
	}
	b := s.Build
	if b == nil {
		return Image{}, false, nil
	}
	df := b.Dockerfile
	if df == "" {
		df = "Dockerfile"
	}
	if !filepath.IsAbs(df) {
		df = filepath.Join(b.Context, df)
	}
	d, err := ParseDockerfile(df)
	if err != nil {
		return Image{}, false, fmt.Errorf("service %q: %w", service, err)
	}
	target := b.Target
	if target == "" {
		target = d.Stages[len(d.Stages)-1].Name // docker build's default: the last stage
	}
	for _, img := range d.Images() {
		if img.Stage == target {
			return img, true, nil
		}
	}
	return Image{}, false, fmt.Errorf("service %q: build target %q of %s is not a runnable stage", service, b.Target, df)
}

// ServiceEnv returns the environment a service's container starts with, as far as the
// repository defines it: the ENV of the Dockerfile stage it is built into, overridden by the
// compose environment. Variables compose lists without a value (unset) are left out.
func ServiceEnv(p *types.Project, service string) (map[string]string, error) {
	img, built, err := ServiceImage(p, service)
	if err != nil {
		return nil, err
	}
	env := map[string]string{}
	if built {
		maps.Copy(env, img.Env)
	}
	for k, v := range p.Services[service].Environment {
		if v != nil {
			env[k] = *v
		}
	}
	return env, nil
}

// ServiceCommand returns the argv a service's container runs: the compose entrypoint, else the
// image's (for a service built from the Dockerfile), followed by the compose command.
func ServiceCommand(p *types.Project, service string) ([]string, error) {
	img, built, err := ServiceImage(p, service)
	if err != nil {
		return nil, err
	}
	s := p.Services[service]
	argv := slices.Clone([]string(s.Entrypoint))
	if len(argv) == 0 && built {
		argv = slices.Clone(img.Entrypoint)
	}
	argv = append(argv, s.Command...)
	if len(argv) == 0 {
		return nil, fmt.Errorf("service %q: no entrypoint or command the repository defines", service)
	}
	return argv, nil
}

// Network maps the addresses services reach each other at on the compose network
// ("kafka:9092", or a bare host name such as "postgres") to addresses on this machine.
type Network map[string]string

// Rewrite replaces, in value, every service address of n that stands on its own: a host:port
// bounded by the start or end of the value or by one of / @ , ; = ? and space (so the host of
// "postgres://keiro:keiro@postgres:5432/keiro" is rewritten and the user name is not). A
// bare host name is rewritten only when it is the whole value (PGHOST=postgres).
func (n Network) Rewrite(value string) string {
	if repl, ok := n[value]; ok && !strings.Contains(value, ":") {
		return repl
	}
	for _, from := range slices.Sorted(maps.Keys(n)) {
		if !strings.Contains(from, ":") {
			continue
		}
		value = replaceBounded(value, from, n[from])
	}
	return value
}

// replaceBounded replaces the occurrences of old in s that are bounded by separators.
func replaceBounded(s, old, repl string) string {
	sep := func(b byte) bool { return strings.IndexByte("/@,;=? ", b) >= 0 }
	var out strings.Builder
	for {
		i := strings.Index(s, old)
		if i < 0 {
			out.WriteString(s)
			return out.String()
		}
		end := i + len(old)
		if (i == 0 || sep(s[i-1])) && (end == len(s) || sep(s[end])) {
			out.WriteString(s[:i])
			out.WriteString(repl)
		} else {
			out.WriteString(s[:end])
		}
		s = s[end:]
	}
}

// checkTopics reports topics the consumer reads or dead-letters to that [TopicInitService]
// does not create: on a broker that creates no topics on first use, the consumer would wait on
// a topic nobody writes, and its dead letters would fail.
func checkTopics(p *types.Project) []error {
	if _, ok := p.Services[TopicInitService]; !ok {
		return nil
	}
	topics, err := InitTopics(p)
	if err != nil {
		return []error{err}
	}
	created := map[string]bool{}
	var names []string
	for _, t := range topics {
		created[t.Name] = true
		names = append(names, t.Name)
	}
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(p.Services)) {
		s := p.Services[name]
		if s.Build == nil || s.Build.Target != "consumer" {
			continue
		}
		v := s.Environment["KEIRO_CONSUMER_TOPICS"]
		if v == nil {
			continue
		}
		for _, topic := range strings.Split(*v, ",") {
			topic = strings.TrimSpace(topic)
			for _, want := range []string{topic, strings.ReplaceAll(inbox.DefaultDeadLetterTopic, "{topic}", topic)} {
				if !created[want] {
					errs = append(errs, fmt.Errorf("service %q: KEIRO_CONSUMER_TOPICS reads %s, but %s does not create %s (TOPICS: %s); add it to TOPICS or fix the name",
						name, topic, TopicInitService, want, strings.Join(names, " ")))
				}
			}
		}
	}
	return errs
}
