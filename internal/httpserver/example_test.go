package httpserver_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http/httptest"

	"github.com/keiro-go/keiro/internal/httpserver"
)

func ExampleNewHandler() {
	h, _, err := httpserver.NewHandler(httpserver.Config{
		Checks: []httpserver.Check{
			{Name: "database", Run: func(context.Context) error { return nil }},
			{Name: "kafka", Run: func(context.Context) error { return errors.New("dial tcp: connection refused") }},
		},
	})
	if err != nil {
		panic(err)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/readyz", nil))
	body, _ := io.ReadAll(rec.Body)
	fmt.Print(rec.Code, " ", string(body))
	// Output:
	// 503 {"status":"unavailable","checks":{"database":"ok","kafka":"error: dial tcp: connection refused"},"failing":["kafka"]}
}
