package upstream

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/xdsrelay/xdsrelay/cache"
	"github.com/xdsrelay/xdsrelay/internal/metrics"
	"github.com/xdsrelay/xdsrelay/internal/testcp"
	"github.com/xdsrelay/xdsrelay/internal/xds"
)

// Clients' rejections are forwarded as NACKs of the control plane's
// response: the first at once; those that come within the interval
// after it together in one; a version once, however often its count of
// rejecting clients leaves zero.
func TestForwardCoalescesAndForwardsOnce(t *testing.T) {
	srv, conn := startScripted(t)
	in := NewRejections()
	c := cache.New(cache.Options{Retention: time.Minute, OnRejected: in.Put})
	w := cache.NewWatch()
	names := []string{"a", "b", "c", "d"}
	c.Watch(w, resourcev3.ClusterType, names...)
	reg := &metrics.Registry{}
	m := NewMetrics(reg)
	st := runClient(t, srv, Options{Conn: conn, Node: &corepb.Node{Id: "n"}, Cache: c, Metrics: m, Rejections: in,
		ForwardNACKs: true, ForwardInterval: time.Second})
	recvReq(t, st)
	var rs []*discoverypb.Resource
	for _, n := range names {
		a, _ := anypb.New(testcp.Cluster(n))
		rs = append(rs, &discoverypb.Resource{Name: n, Version: "1", Resource: a})
	}
	if err := st.Send(&discoverypb.DeltaDiscoveryResponse{TypeUrl: resourcev3.ClusterType, Nonce: "7", Resources: rs}); err != nil {
		t.Fatal(err)
	}
	if ack := recvReq(t, st); ack.GetErrorDetail() != nil {
		t.Fatalf("want an ACK, got %v", ack)
	}
	now := time.Now()
	pending, rejected := cache.Standing{Version: "1", Answer: cache.Pending}, cache.Standing{Version: "1", Answer: cache.Rejected}
	reject := func(name, node string) {
		c.Move(resourcev3.ClusterType, name, cache.Standing{}, pending, now, now, cache.Mover{})
		c.Move(resourcev3.ClusterType, name, pending, rejected, time.Time{}, now, cache.Mover{Node: node, Error: "bad " + name})
	}
	told := func() (string, []xds.Rejected) {
		t.Helper()
		r := recvReq(t, st)
		if r.GetErrorDetail() == nil || r.GetResponseNonce() != "7" || len(r.GetResourceNamesSubscribe()) > 0 {
			t.Fatalf("want a NACK of nonce 7 and nothing else, got %v", r)
		}
		return r.GetErrorDetail().GetMessage(), xds.Forwarded(r.GetErrorDetail(), 10)
	}

	reject("a", "n1")
	if msg, got := told(); msg != "xdsrelay: 1 of 1 clients rejected Cluster a version 1: bad a" || len(got) != 1 || got[0].Name != "a" {
		t.Fatalf("first forwarded NACK: %q %+v", msg, got)
	}
	reject("b", "n1")
	reject("c", "n1")
	if msg, got := told(); len(got) != 2 || got[0].Name != "b" || got[1].Name != "c" || !strings.Contains(msg, "; ") {
		t.Fatalf("the rejections within the interval, together: %q %+v", msg, got)
	}
	// a's rejecting client leaves; another rejects the same version.
	c.Move(resourcev3.ClusterType, "a", rejected, cache.Standing{}, time.Time{}, now, cache.Mover{Node: "n1"})
	reject("a", "n2")
	reject("d", "n2")
	if _, got := told(); len(got) != 1 || got[0].Name != "d" {
		t.Fatalf("after a version already forwarded: %+v, want d alone", got)
	}
	// The count moves just after the send that the control plane has read.
	sent := m.ForwardedNACKs.With(xds.ShortName(resourcev3.ClusterType), "sent")
	eventually(t, "4 forwarded NACKs counted sent", func() bool { return sent.Get() == 4 })
}

// What waits to be forwarded is bounded, and what passes a bound is
// counted dropped: the inbox holds maxInbox; a type waiting for a
// response to NACK holds maxQueued, which go in one NACK whose message
// is clipped to xds.MaxText.
func TestForwardBounds(t *testing.T) {
	in := NewRejections()
	for i := range maxInbox + 3 {
		in.Put(cache.Rejection{Type: resourcev3.ClusterType, Name: fmt.Sprint(i), Version: "1"})
	}
	if list, dropped := in.take(); len(list) != maxInbox || len(dropped) != 1 || dropped[resourcev3.ClusterType] != 3 {
		t.Fatalf("inbox: %d held, dropped %v; want %d and 3 Clusters", len(list), dropped, maxInbox)
	}

	srv, conn := startScripted(t)
	c := cache.New(cache.Options{Retention: time.Minute})
	c.Watch(cache.NewWatch(), resourcev3.ClusterType, "a")
	m := NewMetrics(&metrics.Registry{})
	st := runClient(t, srv, Options{Conn: conn, Node: &corepb.Node{Id: "n"}, Cache: c, Metrics: m, Rejections: in,
		ForwardNACKs: true, ForwardInterval: time.Second})
	recvReq(t, st)
	// No response of the type yet: the rejections wait for one.
	for i := range maxQueued + 4 {
		in.Put(cache.Rejection{Type: resourcev3.ClusterType, Name: fmt.Sprint("r", i), Version: "1", Error: strings.Repeat("e", 200)})
	}
	a, _ := anypb.New(testcp.Cluster("a"))
	if err := st.Send(&discoverypb.DeltaDiscoveryResponse{TypeUrl: resourcev3.ClusterType, Nonce: "7",
		Resources: []*discoverypb.Resource{{Name: "a", Version: "1", Resource: a}}}); err != nil {
		t.Fatal(err)
	}
	if ack := recvReq(t, st); ack.GetErrorDetail() != nil {
		t.Fatalf("want an ACK, got %v", ack)
	}
	r := recvReq(t, st)
	if got := xds.Forwarded(r.GetErrorDetail(), 100); r.GetResponseNonce() != "7" || len(got) != maxQueued {
		t.Fatalf("want a NACK of nonce 7 naming %d versions, got %d: %v", maxQueued, len(got), r)
	}
	if msg := r.GetErrorDetail().GetMessage(); len(msg) > xds.MaxText+32 || !strings.HasSuffix(msg, " bytes)") {
		t.Errorf("the message is not clipped: %d bytes", len(msg))
	}
	short := xds.ShortName(resourcev3.ClusterType)
	if sent, dropped := m.ForwardedNACKs.With(short, "sent").Get(), m.ForwardedNACKs.With(short, "dropped").Get(); sent != maxQueued || dropped != 4 {
		t.Errorf("forwarded NACKs sent %d, dropped %d; want %d and 4", sent, dropped, maxQueued)
	}
}
