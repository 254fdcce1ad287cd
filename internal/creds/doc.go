// Package creds gives both sides of the relay their transport security: TLS
// towards the control plane (optionally with a client certificate, mTLS) and
// TLS towards the Envoys (optionally requiring client certificates signed by
// a CA, mTLS), plus per-RPC headers such as a bearer token for the control
// plane.
//
// A Reloader watches the certificate, key and CA files and serves the newest
// material that loads to every new connection, so certificates rotated on
// disk (including Kubernetes' symlink swap of a mounted secret) take effect
// without a restart. Material that does not load is reported and the
// previous material is kept.
package creds
