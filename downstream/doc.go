// Package downstream serves xDS to Envoy proxies, gRPC clients and other
// relays: the Aggregated Discovery Service in its SotW and incremental
// variants. Each stream keeps its own protocol state (subscriptions,
// nonces, versions, what it was sent, ACKs and NACKs) and reads resources
// from its group's cache, sending the bytes the cache holds.
package downstream
