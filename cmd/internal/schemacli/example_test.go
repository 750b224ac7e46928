package schemacli_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"

	"github.com/keiro-go/keiro/cmd/internal/schemacli"
	"github.com/twmb/franz-go/pkg/sr/srfake"
)

func Example() {
	reg := srfake.NewRegistry() // stands in for a Confluent-compatible registry
	srv := httptest.NewServer(reg.Handler())
	defer srv.Close()
	dir, _ := os.MkdirTemp("", "avsc")
	defer os.RemoveAll(dir)
	file := filepath.Join(dir, "order.avsc")
	_ = os.WriteFile(file, []byte(`{"type":"record","name":"OrderPlaced","namespace":"com.acme",
		"fields":[{"name":"id","type":"string"}]}`), 0o600)

	for _, cmd := range []string{"register", "check"} {
		var out bytes.Buffer
		code := schemacli.Run(context.Background(),
			[]string{cmd, "orders.v1-value", file, "--registry-url", srv.URL}, &out, os.Stdout)
		fmt.Print(strings.ReplaceAll(out.String(), dir+string(filepath.Separator), ""))
		fmt.Println("exit", code)
	}
	// Output:
	// registered order.avsc in subject orders.v1-value: id 1, version 1, fingerprint 5c125de034f9ad7c
	// exit 0
	// compatible: order.avsc can be registered in subject orders.v1-value
	// exit 0
}
