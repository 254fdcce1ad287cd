package upstream

import (
	"fmt"
	"strings"
	"testing"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/proto"
)

// A change of any size is cut into requests no larger than the bound, each
// name subscribed exactly once, the wildcard and every initial version in
// the first request, and a version only beside its name.
func TestSplitKeepsEveryRequestUnderTheBound(t *testing.T) {
	const max = 64 << 10
	c := change{typeURL: "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment",
		node: &corepb.Node{Id: strings.Repeat("n", 1000)}, versions: map[string]string{}}
	c.subscribe = append(c.subscribe, "*")
	for i := range 20000 {
		n := fmt.Sprintf("cla-%05d", i)
		c.subscribe = append(c.subscribe, n)
		if i%2 == 0 {
			c.versions[n] = strings.Repeat("v", 40)
		}
		if i < 3000 {
			c.unsubscribe = append(c.unsubscribe, fmt.Sprintf("old-%05d", i))
		}
	}
	c.versions["wildcard-only"] = "1"
	long := strings.Repeat("x", max)
	c.subscribe = append(c.subscribe, long)
	reqs, skipped := split(c, max)
	if len(reqs) < 3 {
		t.Fatalf("%d requests: the change was not split", len(reqs))
	}
	if len(skipped) != 1 || skipped[0] != long {
		t.Errorf("skipped %d names, want the one too long for any request", len(skipped))
	}
	seen := map[string]int{}
	for i, r := range reqs {
		if size := proto.Size(r); size > max {
			t.Errorf("request %d: %d bytes, over %d", i, size, max)
		}
		if i > 0 && (r.GetNode() != nil || len(r.GetInitialResourceVersions()) > 0) {
			t.Errorf("request %d carries the node or initial versions", i)
		}
		for _, n := range r.GetResourceNamesSubscribe() {
			seen[n]++
		}
		for _, n := range r.GetResourceNamesUnsubscribe() {
			seen["-"+n]++
		}
	}
	first := reqs[0]
	if first.GetNode() == nil || first.GetResourceNamesSubscribe()[0] != "*" {
		t.Errorf("the first request lacks the node or the wildcard")
	}
	for n := range first.GetInitialResourceVersions() {
		if n != "wildcard-only" && seen[n] == 0 {
			t.Errorf("version of %s without its name", n)
		}
	}
	for _, n := range c.subscribe[:len(c.subscribe)-1] {
		if seen[n] != 1 {
			t.Fatalf("%s subscribed %d times", n, seen[n])
		}
	}
	for _, n := range c.unsubscribe {
		if seen["-"+n] != 1 {
			t.Fatalf("%s unsubscribed %d times", n, seen["-"+n])
		}
	}
}
