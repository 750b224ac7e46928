package testkafka

import (
	"context"
	"time"

	"github.com/keiro-go/keiro/keirotest/testenv"
)

func contextWithTimeout(d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), d)
}

// ProduceError answers every partition of a produce request with code: the response a
// control hook (kfake's ControlKey) returns to fail the request.
var ProduceError = testenv.ProduceError
