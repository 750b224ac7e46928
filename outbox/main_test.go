package outbox_test

import (
	"testing"

	"github.com/keiro-go/keiro/keirotest/testenv"
	"github.com/keiro-go/keiro/keirotest/testenv/netproxy"
)

func TestMain(m *testing.M) { testenv.Main(m, netproxy.LeakOptions()...) }
