package main

import "github.com/keiro-go/keiro/cmd/internal/sidecar"

func main() { sidecar.Main(run) }
