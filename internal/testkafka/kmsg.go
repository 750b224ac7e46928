package testkafka

import "github.com/keiro-go/keiro/keirotest/testenv"

// ProduceError answers every partition of a produce request with code: the response a
// control hook (kfake's ControlKey) returns to fail the request.
var ProduceError = testenv.ProduceError
