// Package authz decides which nodes a downstream client may claim, from the
// identities in its verified client certificate: the
// downstream.authorization.rules of the configuration. It knows nothing of
// gRPC or HTTP; the downstream edge turns a denial into its status.
package authz
