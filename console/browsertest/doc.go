// Package browsertest drives the operator console (package console) in a real Chromium through
// chromedp: the pages render, the live views update, and an operator's requeue and retry go
// through the browser with its CSRF token, against a real PostgreSQL and the embedded Kafka.
//
// It is a module of its own (console/browsertest/go.mod, with the repository replacing
// github.com/keiro-go/keiro) so that chromedp and cdproto, which only this test needs, stay out
// of the main module's requirements. `make test` runs it; alone: `cd console/browsertest && go
// test ./...`. It needs Debian's chromium (or KEIRO_TEST_CHROMIUM) and fails without it.
package browsertest
