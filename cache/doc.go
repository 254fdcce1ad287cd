// Package cache holds, for one group of downstream clients, the resources the
// relay has received from upstream, already encoded, and who watches them.
//
// A Cache is the meeting point of the two sides of the relay: the upstream
// client writes each response into it whole (Apply) and reads the union of what the
// group wants from it (Interest); downstream streams register what they want
// (Watch*) and are woken through their Watch when something they watch
// changes. The cache calls into neither side but through what it is given
// (the Options' On* callbacks, a Watch's OnReady), never with its locks
// held, and never blocks on a watcher: a change marks each watcher's dirty
// set and wakes it (a capacity-1 channel, or its OnReady), and the watcher
// reads the latest state when it is ready.
//
// Resources are immutable once stored: the same encoded bytes are shared by
// every stream that sends them (docs/architecture.md, invariant 3 "Encode
// once").
package cache
