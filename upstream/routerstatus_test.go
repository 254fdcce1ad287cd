package upstream

import (
	"context"
	"log/slog"
	"testing"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/xdsrelay/xdsrelay/cache"
	"github.com/xdsrelay/xdsrelay/internal/metrics"
)

// A routed feed's Status, which the admin endpoint and the metrics ask at
// any time, reads its members' feeds under its lock: a member whose stream
// closes meanwhile is seen running or not at all, never half stopped (run
// with -race).
func TestRoutedStatusWhileMembersStartAndStop(t *testing.T) {
	var sources []Source
	for range 2 {
		f, err := NewFile(t.TempDir(), slog.New(slog.DiscardHandler), nil)
		if err != nil {
			t.Fatal(err)
		}
		sources = append(sources, f)
	}
	routes, err := NewRoutes([]Claim{{Name: DefaultUpstream}, {Name: "secrets", Types: []string{resourcev3.SecretType}}})
	if err != nil {
		t.Fatal(err)
	}
	reg := &metrics.Registry{}
	r, err := NewRouter(routes, sources, NewMetrics(reg), reg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	feed, err := r.Feed(Group{ID: "g", Node: &corepb.Node{}, Cache: cache.New(cache.Options{Retention: time.Minute})})
	if err != nil {
		t.Fatal(err)
	}
	rf := feed.(*routedFeed)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 200 {
			rf.start(ctx, 1)
			rf.stop(1)
		}
	}()
	for {
		select {
		case <-done:
			return
		default:
			rf.Status()
		}
	}
}
