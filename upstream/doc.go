// Package upstream keeps a group's cache filled: Client holds one delta-ADS
// stream to the control plane per group, subscribed to the union of what the
// group's clients want, and File serves a directory of resource files as if
// a control plane had sent them (the embedded default).
package upstream
