package upstream

import (
	"slices"
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
)

// The does-not-exist timer reports only what upstream left unanswered: a
// name the control plane removed first is not reported again, and a name
// the stream resumed with (in initial_resource_versions) is not timed out.
func TestNotFoundTimerLeavesAnsweredNames(t *testing.T) {
	srv, conn := startScripted(t)

	const eds = resourcev3.EndpointType
	c := cache.New(cache.Options{Retention: time.Minute})
	c.Import([]cache.TypeState{{TypeURL: eds, Resources: []*cache.Resource{{Name: "cached", Version: "1", Any: []byte("x"), Wire: []byte("x")}}}})
	gone, never := cache.NewWatch(), cache.NewWatch()
	c.Watch(gone, eds, "gone", "cached")
	c.Watch(never, eds, "never")
	const timeout = 200 * time.Millisecond
	st := runClient(t, srv, Options{Conn: conn, Node: &corepb.Node{Id: "n"}, Cache: c, Metrics: NewMetrics(&metrics.Registry{}), NotFoundTimeout: timeout})
	if sub := recvReq(t, st); sub.GetInitialResourceVersions()["cached"] != "1" {
		t.Fatalf("first request: %v", sub)
	}
	if err := st.Send(&discoverypb.DeltaDiscoveryResponse{TypeUrl: eds, Nonce: "1", RemovedResources: []string{"gone"}}); err != nil {
		t.Fatal(err)
	}
	recvReq(t, st) // the ACK
	gone.Take()
	select {
	case <-never.Ready():
	case <-time.After(10 * time.Second):
		t.Fatal("the unanswered name was never reported")
	}
	l := c.Get(eds, []string{"gone", "never", "cached"})
	if !l[0].Absent || !l[1].Absent || l[2].Resource == nil {
		t.Fatalf("after the timer: gone %+v, never %+v, cached %+v", l[0], l[1], l[2])
	}
	if d := gone.Take(); d != nil {
		t.Fatalf("names upstream had answered were marked again: %v", d.Of(eds).Names)
	}

	// Should it arrive after the timer, it is applied like any update.
	never.Take()
	a, err := anypb.New(testcp.Endpoints("never", "127.0.0.1:1"))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&discoverypb.DeltaDiscoveryResponse{TypeUrl: eds, Nonce: "2",
		Resources: []*discoverypb.Resource{{Name: "never", Version: "1", Resource: a}}}); err != nil {
		t.Fatal(err)
	}
	if ack := recvReq(t, st); ack.GetErrorDetail() != nil {
		t.Fatalf("the late resource was NACKed: %v", ack.GetErrorDetail())
	}
	select {
	case <-never.Ready():
	case <-time.After(10 * time.Second):
		t.Fatal("the late resource was never delivered")
	}
	if l := c.Get(eds, []string{"never"})[0]; l.Resource == nil || l.Absent {
		t.Fatalf("after the late response: %+v", l)
	}
}

// A name too long for upstream.max_request_bytes is never sent upstream;
// the does-not-exist timer reports it as not existing, so that its
// watchers are answered.
func TestNotFoundTimerReportsNameTooLongToAsk(t *testing.T) {
	srv, conn := startScripted(t)

	const eds = resourcev3.EndpointType
	c := cache.New(cache.Options{Retention: time.Minute})
	long := strings.Repeat("x", 1000)
	w := cache.NewWatch()
	c.Watch(w, eds, "short", long)
	st := runClient(t, srv, Options{Conn: conn, Node: &corepb.Node{Id: "n"}, Cache: c, Metrics: NewMetrics(&metrics.Registry{}),
		NotFoundTimeout: 100 * time.Millisecond, MaxRequestBytes: 512})
	if sub := recvReq(t, st); !slices.Equal(sub.GetResourceNamesSubscribe(), []string{"short"}) {
		t.Fatalf("first request subscribes %v, want only the short name", sub.GetResourceNamesSubscribe())
	}
	deadline := time.After(10 * time.Second)
	for {
		if l := c.Get(eds, []string{long}); l[0].Absent {
			return
		}
		select {
		case <-w.Ready():
			w.Take()
		case <-deadline:
			t.Fatal("the name too long to ask for was never reported as not existing")
		}
	}
}
