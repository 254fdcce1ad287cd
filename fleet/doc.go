// Package fleet is what replicas of one relay know of each other: who is a
// member, which member owns which group, and how many clients each member
// should hold.
//
// Members are the addresses fleet.peers resolves to, re-resolved every
// fleet.refresh, each in the view while it answers the exchange that every
// member makes with every other (Exchange, on the xDS port), and out of it
// within the timeout after it stops answering. Each group key has one
// owner: the live member that ranks first by rendezvous (highest random
// weight) hash of the key and the member (Ring), so that a member that
// comes or goes moves only the groups it gains or owned. The exchange also
// carries each member's client count and view: a member over the bound,
// (1 + fleet.balance_slack) times the fleet's mean and at least the mean
// rounded up plus one (Bound), learns how many to shed (Excess), and views that differ are counted (docs/architecture.md,
// invariant 22 "One fetch per group per fleet").
//
// The package knows nothing of xDS streams or caches: the relay wiring asks
// it where a group comes from, turns "from a peer" into an upstream like any
// other, and tells it how many clients the relay holds.
package fleet
