package downstream

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	clusterpb "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/xdsrelay/xdsrelay/cache"
	"github.com/xdsrelay/xdsrelay/internal/metrics"
	"github.com/xdsrelay/xdsrelay/internal/xds"
)

// A poll that names a resource twice, or names "", is counted against
// limits.max_names_per_stream by the distinct names it subscribes to, as a
// stream is, and is answered with each resource once.
func TestFetchCountsDistinctNames(t *testing.T) {
	c := cache.New(cache.Options{})
	var rs []*cache.Resource
	for _, name := range []string{"a", "b"} {
		a, err := anypb.New(&clusterpb.Cluster{Name: name})
		if err != nil {
			t.Fatal(err)
		}
		r, err := xds.Encode(name, "1", a, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		rs = append(rs, r)
	}
	w := cache.NewWatch() // the cache keeps only what someone watches
	c.WatchWildcard(w, resourcev3.ClusterType)
	defer c.Release(w)
	c.Apply(resourcev3.ClusterType, cache.Change{Upserts: rs, Synced: true})
	s, err := New(Options{Groups: oneGroup{c}, Metrics: &metrics.Registry{},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Limits: Limits{MaxNamesPerStream: 2}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req := &discoverypb.DiscoveryRequest{Node: &corepb.Node{Id: "poller"}, ResourceNames: []string{"b", "a", "a", "", "b"}}
	resp, err := s.fetch(ctx, client{variant: "fetch"}, req, resourcev3.ClusterType)
	if err != nil {
		t.Fatalf("poll for 2 distinct names under a limit of 2: %v", err)
	}
	var got []string
	for _, a := range resp.GetResources() {
		cl := &clusterpb.Cluster{}
		if err := a.UnmarshalTo(cl); err != nil {
			t.Fatal(err)
		}
		got = append(got, cl.GetName())
	}
	if len(got) != 2 || got[0] != "a" || got[1] != "b" {
		t.Fatalf("poll answered %v, want [a b]", got)
	}

	req.ResourceNames = []string{"a", "b", "c"}
	if _, err := s.fetch(ctx, client{variant: "fetch"}, req, resourcev3.ClusterType); err == nil {
		t.Fatal("poll for 3 names under a limit of 2 was answered")
	}
}

// A poll held because nothing changed ends when the server drains, with
// the relay's own UNAVAILABLE status (the README's Shutdown section).
func TestFetchHeldPollEndsOnDrain(t *testing.T) {
	c := cache.New(cache.Options{})
	a, err := anypb.New(&clusterpb.Cluster{Name: "a"})
	if err != nil {
		t.Fatal(err)
	}
	r, err := xds.Encode("a", "1", a, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	w := cache.NewWatch()
	c.WatchWildcard(w, resourcev3.ClusterType)
	defer c.Release(w)
	c.Apply(resourcev3.ClusterType, cache.Change{Upserts: []*cache.Resource{r}, Synced: true})
	s, err := New(Options{Groups: oneGroup{c}, Metrics: &metrics.Registry{}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req := &discoverypb.DiscoveryRequest{Node: &corepb.Node{Id: "poller"}}
	resp, err := s.fetch(ctx, client{variant: "fetch"}, req, resourcev3.ClusterType)
	if err != nil {
		t.Fatal(err)
	}
	req.VersionInfo = resp.GetVersionInfo() // the client has it: the poll is held
	ended := make(chan error, 1)
	go func() {
		_, err := s.fetch(ctx, client{variant: "fetch"}, req, resourcev3.ClusterType)
		ended <- err
	}()
	s.Drain()
	select {
	case err := <-ended:
		if err != errDraining {
			t.Fatalf("the held poll ended with %v, want %v", err, errDraining)
		}
	case <-ctx.Done():
		t.Fatal("the held poll did not end on Drain")
	}
}
