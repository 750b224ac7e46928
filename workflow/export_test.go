package workflow

// EncodeStepMap and DecodeStepMap expose the snapshot codec to the package's tests.
var (
	EncodeStepMap = encodeStepMap
	DecodeStepMap = decodeStepMap
)
