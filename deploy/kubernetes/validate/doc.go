// Package validate checks the Kubernetes manifests of deploy/kubernetes without a cluster: every
// manifest decodes strictly (unknown or misspelt fields are errors) into the Kubernetes API
// types and the Prometheus Operator's, every kustomization lists exactly the manifests beside
// it and builds, and the built workloads follow the rules docs/operations.md states (probes,
// resources, non-root, secrets from files, shutdown headroom under the grace period, a
// disruption budget and a scrape target per workload, alert rules equal to
// deploy/prometheus/alerts.yml). Its tests then submit every built object to a real
// kube-apiserver backed by etcd (package internal/apiserver builds and runs them) as a
// server-side dry run with strict field validation, with the Prometheus Operator's CRDs
// (package internal/crds) installed: every object must be accepted, and real mistakes must be
// rejected with the field named.
//
// It is a module of its own so that the Kubernetes dependencies stay out of keiro's go.mod;
// `make deploy-check` (part of `make test`) runs it.
package validate
