// Package loadstats holds, for one group of downstream clients, the load
// they report (LRS, envoy.service.load_stats.v3) and what the control plane
// asked to be told: the cache of the reverse flow.
//
// A Store is where the two sides of the relay meet for load reports, as a
// cache.Cache is for resources. The downstream's load reporting service
// joins a Reporter per client stream, writes each report in (Report) and
// reads what the client is to be told (Next). The upstream's load reporter
// tells the store what the control plane asked for (Instruct), closes a
// period on the control plane's interval (Cut) and sends what is pending
// (Pending, Delivered). The store never calls into either side but through
// the callbacks it is given, and never while holding its lock.
//
// Counts over an interval (requests, drops, connections, named metrics) are
// summed per cluster and EDS service name, per locality and priority, and
// per endpoint when the control plane asks for endpoint granularity. Gauges
// (requests in progress, active connections) are each client's latest
// value, summed: a report replaces its client's gauges whole, and a client
// that leaves takes its gauges with it while its counts stay in the sum.
//
// Every number a client sends has an edge (docs/architecture.md,
// invariant 9): a period sums Options.MaxNames names at most, load
// metrics that are NaN, infinite or negative are refused, sums saturate
// instead of wrapping, each counted through the store's callbacks. Held
// periods are encoded and bounded in count (past it the oldest are
// dropped) and in bytes (past it they are merged into one, and the oldest
// dropped only if that does not fit: pending.go); the control plane's
// interval is raised to Options.MinInterval.
package loadstats
