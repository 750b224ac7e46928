// Package validate checks the Kubernetes manifests of deploy/kubernetes without a cluster: every
// manifest decodes strictly (unknown or misspelt fields are errors) into the Kubernetes API
// types and the Prometheus Operator's, every kustomization lists exactly the manifests beside
// it and builds, and the built workloads follow the rules docs/operations.md states (probes,
// resources, non-root, secrets from files, shutdown headroom under the grace period, a
// disruption budget and a scrape target per workload, alert rules equal to
// deploy/prometheus/alerts.yml).
//
// It is a module of its own so that the Kubernetes dependencies stay out of keiro's go.mod;
// `make deploy-check` (part of `make test`) runs it.
package validate
