// Package downstream serves xDS to Envoy proxies, gRPC clients and other
// relays: the Aggregated Discovery Service and the per-type services, each
// in its SotW and incremental variants, REST-JSON and gRPC Fetch polls,
// CSDS, and the load reporting service (LRS). Each stream keeps its own
// protocol state (subscriptions, nonces, versions, what it was sent, ACKs
// and NACKs) and reads resources from its group's cache, sending the bytes
// the cache holds; a shared pool of send workers flushes what the caches
// mark (sendpool.go).
package downstream
