package fleet

import (
	"github.com/cespare/xxhash/v2"
	"github.com/dgryski/go-rendezvous"
)

// Ring says which member owns a key: the one that ranks first by
// rendezvous (highest random weight) hash of the key and the member.
// Adding or removing one of N members moves about 1/N of the keys, and
// only those the member gains or owned. Immutable: a view change makes a
// new one.
type Ring struct {
	members []string
	rdv     *rendezvous.Rendezvous
}

// NewRing is the ring over members (sorted, each once).
func NewRing(members []string) *Ring {
	return &Ring{members: members, rdv: rendezvous.New(members, xxhash.Sum64String)}
}

// Owner is the member that owns key; "" for an empty ring.
func (r *Ring) Owner(key string) string {
	if r == nil {
		return ""
	}
	return r.rdv.Lookup(key)
}

// Members are the ring's members, sorted.
func (r *Ring) Members() []string {
	if r == nil {
		return nil
	}
	return r.members
}
