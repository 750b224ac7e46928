package console

// LoopbackHost exports loopbackHost to the tests.
var LoopbackHost = loopbackHost
