//go:build tools

// Package tools pins the versions of the development tools the Makefile runs (golangci-lint),
// in a module of its own so that their dependencies stay out of keiro-go's go.mod. Run one
// with `go build -C tools -o bin/ <package>` from the repository root, as `make lint` does.
package tools

import (
	_ "github.com/golangci/golangci-lint/v2/cmd/golangci-lint"
)
