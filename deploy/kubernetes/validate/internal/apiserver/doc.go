// Package apiserver runs a real Kubernetes API server for the manifest checks: kube-apiserver,
// built once per machine from the pinned k8s.io/kubernetes release, backed by etcd (Debian's
// etcd-server package), both on loopback, both dying with the process that started them. With
// it a test submits the manifests as a cluster would receive them (a server-side dry run with
// strict field validation), so the API server's own validation and defaulting judge them, not a
// copy of its rules.
//
// A missing prerequisite (etcd, the Go toolchain, the network for the first build's modules) is
// an error that says what to install, never a reason to skip.
package apiserver
