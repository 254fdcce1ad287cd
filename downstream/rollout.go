package downstream

import "hash/fnv"

// The canary rollout's side in a stream (cache.Rollout): which stream is a
// canary is told to the cache by the watch's rank, a hash of the node id
// (the same node ranks the same on every stream and after every
// reconnect); what a stream reads, candidate or released, is the cache's
// business (ReadFor, StateFor); each ACK or NACK is passed on with the
// version it answers (Verdict).

// Rank is a node id's rank among the canaries of its group (rollout.canary):
// the lowest-ranked clients of each type are its canaries. It is FNV-1a
// (64 bits) of the id, so an operator can tell which nodes are canaries.
func Rank(nodeID string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(nodeID))
	return h.Sum64()
}

// sentVersion is the last response of a type: its nonce and the cache
// version it carried.
type sentVersion struct {
	nonce   string
	version uint64
}

// sentAs records the version a response carried, for the verdict on it;
// only while the group's cache rolls changes out.
func (b *streamBase) sentAs(typeURL, nonce string, version uint64) {
	if !b.cache.RollingOut() {
		return
	}
	if b.sent == nil {
		b.sent = map[string]sentVersion{}
	}
	b.sent[typeURL] = sentVersion{nonce: nonce, version: version}
}

// verdict passes a client's answer to the last response of a type on to
// the cache; answers to older responses are not (a newer one is in
// flight).
func (b *streamBase) verdict(typeURL, nonce string, nack bool, detail string) {
	s, ok := b.sent[typeURL]
	if !ok || s.nonce != nonce {
		return
	}
	b.cache.Verdict(b.watch, typeURL, s.version, nack, b.node.GetId(), detail)
}
