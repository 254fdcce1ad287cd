// Package metrics is the relay's counters, gauges and histograms, exposed in
// the Prometheus formats by github.com/prometheus/client_golang, with the Go
// runtime and process metrics.
//
// client_golang rather than the OpenTelemetry Prometheus exporter: the relay
// deletes a group's series when the group ends and sets absolute values
// (cache sizes, eviction counts) at scrape time, which OpenTelemetry's
// synchronous instruments cannot do; client_golang's collectors do both.
//
// Every label value is bounded: one longer than MaxLabelLen bytes is
// exposed as its short hash ("sha256:" and 16 hex digits), and the group
// label can be dropped altogether (Options.NoGroupLabel). The relay labels
// a group by its id (relay.GroupID), which is shorter.
package metrics
