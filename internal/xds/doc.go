// Package xds holds what both sides of the relay share about the xDS wire:
// the resource types it relays, how a resource is encoded once into the bytes
// that responses carry, and the gRPC codec that sends responses assembled
// from those bytes without re-marshalling them and decodes upstream
// responses (Received) straight from gRPC's received frames.
package xds
