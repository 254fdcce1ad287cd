// Package deploy holds what runs the relay in Kubernetes: the manifests
// (base/, applied with kubectl apply -k deploy/), the admin mTLS overlay
// (overlays/admin-mtls), the Helm chart (helm/xdsrelay), a Grafana
// dashboard (grafana/) and Prometheus alerting rules (prometheus/); and the
// tests that render the installs with kustomize's and Helm's own Go
// libraries, decode them strictly into the Kubernetes API types, run the
// relay they build as the pods would, and evaluate the alerts with
// Prometheus's PromQL engine over its scraped samples. It is its own module
// so that the relay carries no Kubernetes, Helm or Prometheus-server
// dependencies.
package deploy
