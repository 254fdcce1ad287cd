// Package relay wires the upstream, the caches and the downstream server
// together and owns their lifecycle: groups come and go with their clients,
// and Shutdown drains in order (stop accepting, end streams with a deadline,
// close upstream).
package relay
