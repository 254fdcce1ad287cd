package upstream

import (
	"maps"
	"slices"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// DefaultMaxRequestBytes is a little under gRPC's default receive limit
// (4 MiB), which most control planes keep.
const DefaultMaxRequestBytes = 4<<20 - 64<<10

// Field numbers of envoy.service.discovery.v3.DeltaDiscoveryRequest.
const (
	fieldSubscribe   = 3
	fieldUnsubscribe = 4
	fieldVersions    = 5
)

// change is one type's subscription change, before it is cut into requests.
type change struct {
	typeURL     string
	node        *corepb.Node      // for the stream's first request only
	subscribe   []string          // "*" first if the wildcard is subscribed
	unsubscribe []string          //
	versions    map[string]string // initial_resource_versions: the type's first request only
	// legacy asks the wildcard ("*" first in subscribe) in the legacy
	// form: a first request of the type that names nothing (see split).
	legacy bool
}

// packer fills requests up to a size.
type packer struct {
	max  int
	base int // the size of a request with only the type URL
	reqs []*discoverypb.DeltaDiscoveryRequest
	size int // of the last request
}

func (p *packer) last() *discoverypb.DeltaDiscoveryRequest { return p.reqs[len(p.reqs)-1] }

// seal takes nothing more into the last request: what comes next starts
// another.
func (p *packer) seal() { p.size = p.max }

// fits reports whether n more bytes fit in the last request.
func (p *packer) fits(n int) bool { return p.size+n <= p.max }

// room returns a request with n more bytes of room, starting one if the last
// is full; ok is false if n does not fit even in an empty request.
func (p *packer) room(typeURL string, n int) (*discoverypb.DeltaDiscoveryRequest, bool) {
	if p.base+n > p.max {
		return nil, false
	}
	if !p.fits(n) {
		p.reqs = append(p.reqs, &discoverypb.DeltaDiscoveryRequest{TypeUrl: typeURL})
		p.size = p.base
	}
	p.size += n
	return p.last(), true
}

func nameSize(n string) int { return protowire.SizeTag(fieldSubscribe) + protowire.SizeBytes(len(n)) }

func versionSize(n, v string) int {
	entry := protowire.SizeTag(1) + protowire.SizeBytes(len(n)) + protowire.SizeTag(2) + protowire.SizeBytes(len(v))
	return protowire.SizeTag(fieldVersions) + protowire.SizeBytes(entry)
}

// split cuts a subscription change into requests of at most max bytes, so
// that no subscription or resume, however many names it holds, is refused
// by the control plane's message limit. The first request carries the
// wildcard, and the initial_resource_versions of as many cached names as
// fit ("Incremental reconnect example": only the first request of a type
// may carry them); the names that did not fit are subscribed in the
// following requests, without a version (upstream sends them again). Names
// that do not fit even in an empty request are returned in skipped.
//
// With c.legacy the wildcard is the first request's empty subscribe (spec
// "How the client specifies what resources to return", and "Incremental
// reconnect example" for a resume): it names nothing, and carries only the
// versions of what the wildcard alone holds; every name subscribed beside
// the wildcard, versionless, follows in the next requests. A server that
// knows no explicit "*" (go-control-plane v0.10) reads the wildcard only
// so, and takes a stream's first request of a type with names for a
// request of those names alone; a version without its name could be
// answered with a removal before the name is asked.
func split(c change, max int) (reqs []*discoverypb.DeltaDiscoveryRequest, skipped []string) {
	first := &discoverypb.DeltaDiscoveryRequest{TypeUrl: c.typeURL, Node: c.node}
	p := &packer{max: max, base: proto.Size(&discoverypb.DeltaDiscoveryRequest{TypeUrl: c.typeURL}),
		reqs: []*discoverypb.DeltaDiscoveryRequest{first}}
	p.size = proto.Size(first)
	subs := c.subscribe
	wildcard := len(subs) > 0 && subs[0] == "*"
	if wildcard {
		subs = subs[1:]
	}
	if wildcard && !c.legacy {
		first.ResourceNamesSubscribe = []string{"*"}
		p.size += nameSize("*")
	}
	subs = p.resume(c, subs)
	if wildcard && c.legacy {
		p.seal() // the names follow the legacy wildcard
	}
	for _, n := range subs {
		if r, ok := p.room(c.typeURL, nameSize(n)); ok {
			r.ResourceNamesSubscribe = append(r.ResourceNamesSubscribe, n)
		} else {
			skipped = append(skipped, n)
		}
	}
	for _, n := range c.unsubscribe {
		if r, ok := p.room(c.typeURL, nameSize(n)); ok {
			r.ResourceNamesUnsubscribe = append(r.ResourceNamesUnsubscribe, n)
		} else {
			skipped = append(skipped, n)
		}
	}
	return p.reqs, skipped
}

// resume puts in the first request the initial versions of as many cached
// names as fit, each subscribed beside its version if it is subscribed by
// name (never under the legacy wildcard, whose first request names
// nothing). It returns the names left to subscribe.
func (p *packer) resume(c change, subs []string) []string {
	if len(c.versions) == 0 {
		return subs
	}
	first := p.reqs[0]
	named := make(map[string]bool, len(subs))
	for _, n := range subs {
		named[n] = true
	}
	var rest []string
	for _, n := range subs {
		v, ok := c.versions[n]
		need := versionSize(n, v) + nameSize(n)
		if !ok || c.legacy || !p.fits(need) {
			rest = append(rest, n)
			continue
		}
		p.size += need
		if first.InitialResourceVersions == nil {
			first.InitialResourceVersions = make(map[string]string)
		}
		first.InitialResourceVersions[n] = v
		first.ResourceNamesSubscribe = append(first.ResourceNamesSubscribe, n)
	}
	// What only the wildcard holds: a version if it fits, else sent again.
	for _, n := range slices.Sorted(maps.Keys(c.versions)) {
		if v := c.versions[n]; !named[n] && p.fits(versionSize(n, v)) {
			if first.InitialResourceVersions == nil {
				first.InitialResourceVersions = make(map[string]string)
			}
			first.InitialResourceVersions[n] = v
			p.size += versionSize(n, v)
		}
	}
	return rest
}
