package inbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// ErrGroupUnknown reports a consumer group Kafka does not know: it never joined nor committed
// (a consumer that has just started, or a wrong group name).
var ErrGroupUnknown = errors.New("the consumer group is not known to Kafka")

// GroupLag asks Kafka for group's lag: per partition of its topics, the end offset minus the
// group's committed offset (from the log start when nothing is committed), with the partition's
// member. It is what the consumer's keiro.consumer.lag gauge, `consumer status` and the console
// report. An unknown group is ErrGroupUnknown; a per-partition error stays in its partition's
// entry.
func GroupLag(ctx context.Context, cl *kgo.Client, group string) (kadm.DescribedGroupLag, error) {
	lags, err := kadm.NewClient(cl).Lag(ctx, group)
	if err != nil {
		return kadm.DescribedGroupLag{}, fmt.Errorf("read the lag of group %s from Kafka: %w", group, err)
	}
	l, ok := lags[group]
	if !ok {
		return kadm.DescribedGroupLag{}, fmt.Errorf("group %s: %w", group, ErrGroupUnknown)
	}
	if err := l.Error(); errors.Is(err, kerr.GroupIDNotFound) {
		return l, fmt.Errorf("group %s: %w", group, ErrGroupUnknown)
	} else if err != nil {
		return l, fmt.Errorf("read the lag of group %s from Kafka: %w", group, err)
	}
	return l, nil
}
