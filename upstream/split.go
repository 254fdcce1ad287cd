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
}

// packer fills requests up to a size.
type packer struct {
	max  int
	base int // the size of a request with only the type URL
	reqs []*discoverypb.DeltaDiscoveryRequest
	size int // of the last request
}

func (p *packer) last() *discoverypb.DeltaDiscoveryRequest { return p.reqs[len(p.reqs)-1] }

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
func split(c change, max int) (reqs []*discoverypb.DeltaDiscoveryRequest, skipped []string) {
	first := &discoverypb.DeltaDiscoveryRequest{TypeUrl: c.typeURL, Node: c.node}
	p := &packer{max: max, base: proto.Size(&discoverypb.DeltaDiscoveryRequest{TypeUrl: c.typeURL}),
		reqs: []*discoverypb.DeltaDiscoveryRequest{first}}
	p.size = proto.Size(first)
	subs := c.subscribe
	if len(subs) > 0 && subs[0] == "*" {
		first.ResourceNamesSubscribe, subs = []string{"*"}, subs[1:]
		p.size += nameSize("*")
	}
	subs = p.resume(c, subs)
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
// name. It returns the names left to subscribe.
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
		if !ok || !p.fits(need) {
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
