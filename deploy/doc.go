// Package deploy holds the Kubernetes manifests for xdsrelay (plain YAML,
// listed in kustomization.yaml) and the tests that decode them strictly
// into the Kubernetes API types; a Grafana dashboard (grafana/) and
// Prometheus alerting rules (prometheus/), and the tests that parse their
// PromQL and check, against a relay they build and drive, that every
// metric and label they use is on its /metrics. It is its own module so
// that the relay carries no Kubernetes or Prometheus-server dependencies.
package deploy
