package xds

import "time"

// Resource is one resource as the relay stores and sends it, encoded once
// for every stream that sends it. It is immutable once encoded: its bytes
// are shared by every stream.
type Resource struct {
	Name    string
	Version string
	// Upstream is the version of the response the resource came in, as
	// the control plane set it: a SotW response's version_info, a delta
	// response's system_version_info; "" if none. One string shared by
	// every resource of the response. Version stays the cache's (a delta
	// control plane's resource version, or a hash of the bytes): Upstream
	// is what lets a version at one tier be found at the next.
	Upstream string
	// Any is the encoded google.protobuf.Any, as a SotW response carries it.
	Any []byte
	// Wire is the encoded envoy.service.discovery.v3.Resource (name,
	// version, resource, aliases, ttl), as a delta response carries it.
	Wire []byte
	// Aliases are the resource's aliases (VHDS), if any.
	Aliases []string
	// TTL is the resource's time to live as upstream set it, zero if none.
	// With a TTL the resource is also encoded for clients that do not
	// support TTLs (WireNoTTL) and, wrapped in a Resource, for SotW clients
	// that do (SotWWrapped); without one those are nil.
	TTL         time.Duration
	WireNoTTL   []byte
	SotWWrapped []byte
	// Warm is, for a Cluster whose endpoints come from EDS, the name of
	// the ClusterLoadAssignment that finishes its warming in Envoy ("Resource
	// warming"): a stream that is sent the Cluster new or changed and holds
	// those endpoints is sent them again. Empty for every other resource.
	Warm string
	// Refs are the names the resource points at (Refs): what a client
	// needs besides it, decoded once when it is encoded. Nil if none.
	Refs []Ref
}

// Heartbeat refreshes a resource's TTL without changing it ("TTL"): the
// resource's name and version, its new TTL, and its encodings for delta
// (Wire) and SotW (SotW, wrapped in a Resource) clients.
type Heartbeat struct {
	Name, Version string
	TTL           time.Duration
	Wire, SotW    []byte
}

// ResourceError is an error for one resource (xDS TP3, gRFC A88): the
// control plane's, or one the relay makes where it knows the answer
// (NOT_FOUND, PERMISSION_DENIED, UNAVAILABLE). It is encoded once for the
// resource_errors field of delta (Delta) and SotW (SotW) responses.
type ResourceError struct {
	Name        string
	Code        int32  // the google.rpc.Code of error_detail
	Message     string // error_detail's message
	Delta, SotW []byte
}
