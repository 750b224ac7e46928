package outbox_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/keiro-go/keiro/keirotest/testenv"
)

func TestMain(m *testing.M) {
	testenv.Main(m,
		// pgxpool's background health check and kfake's listeners are closed by t.Cleanup;
		// these are process-wide helpers of the libraries that outlive a test by design.
		goleak.IgnoreTopFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck"),
	)
}
