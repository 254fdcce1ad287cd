// Package upstream keeps a group's cache filled. A Source gives each group
// a Feed: Client holds one stream to a control plane per group, in the
// protocol each server is found to speak (delta ADS, SotW ADS or the
// per-type SotW services), subscribed to the union of what the group's
// clients want, and moves between the control plane's servers by gRFC
// A71's rules; File serves a directory of resource files as if a control
// plane had sent them (the embedded default); Router splits a group's
// interest among several control planes by the names' xdstp authorities
// and types, and runs a Client for each one with a share. The package
// also reports the groups' load to the control plane (LoadReporter) and
// tells it of the versions clients rejected (forward.go).
package upstream
