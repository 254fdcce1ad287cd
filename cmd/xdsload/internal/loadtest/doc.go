// Package loadtest drives load against an xDS server and measures how it
// copes: many downstream clients, each on its own gRPC connection, that
// subscribe, ACK every response and record when each update reaches them.
//
// It can also run the control plane itself (a go-control-plane server with
// numbered updates, so that clients recognise each update by the sequence
// number carried in the resource), and two floors for comparison: the gRPC
// floor, a bare grpc-go server that writes each stream the bytes the relay
// would send, encoded ahead of time; and the socket floor, as many bytes
// written to as many plain TCP connections.
//
// A soak (Config.Soak) keeps clients reconnecting, resubscribing and
// NACKing through xdsrelay while the control plane changes and restarts,
// samples the relay's process on a schedule, and holds each figure to its
// value once settled: a leak shows as a figure that keeps moving.
//
// Run is the entry point; cmd/xdsload is its command line.
package loadtest
