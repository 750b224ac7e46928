package workflow_test

import (
	"testing"

	"github.com/keiro-go/keiro/keirotest/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }
