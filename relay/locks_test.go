package relay

import (
	"context"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/xdsrelay/xdsrelay/cache"
	"github.com/xdsrelay/xdsrelay/downstream"
	"github.com/xdsrelay/xdsrelay/internal/testcp"
)

// lockProbe is a log handler that, at each record whose message starts
// with prefix, takes the relay's mu as any reader of the groups does:
// the callback that logs the record would deadlock if it ran under that
// lock. It tries for a bound instead of blocking, so that the test fails
// rather than hangs, and counts the records it got the lock at and those
// it did not.
type lockProbe struct {
	slog.Handler
	prefix   string
	r        *atomic.Pointer[Relay]
	got, not *atomic.Int32
}

func (h lockProbe) Handle(ctx context.Context, rec slog.Record) error {
	if r := h.r.Load(); r != nil && strings.HasPrefix(rec.Message, h.prefix) {
		if tryLockWithin(&r.mu, 2*time.Second) {
			r.mu.Unlock()
			h.got.Add(1)
		} else {
			h.not.Add(1)
		}
	}
	if !h.Handler.Enabled(ctx, rec.Level) {
		return nil
	}
	return h.Handler.Handle(ctx, rec)
}

// Enabled sees every record: the probe is not bound by the level.
func (h lockProbe) Enabled(context.Context, slog.Level) bool { return true }

func (h lockProbe) WithAttrs(as []slog.Attr) slog.Handler {
	h.Handler = h.Handler.WithAttrs(as)
	return h
}

func (h lockProbe) WithGroup(name string) slog.Handler {
	h.Handler = h.Handler.WithGroup(name)
	return h
}

// tryLockWithin takes mu unless it stays held for d.
func tryLockWithin(mu interface{ TryLock() bool }, d time.Duration) bool {
	for end := time.Now().Add(d); !mu.TryLock(); time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			return false
		}
	}
	return true
}

// probedRelay starts a relay in front of cp whose log is probed at records
// starting with prefix (see lockProbe); got and not count them.
func probedRelay(t *testing.T, cp *testcp.ControlPlane, prefix string, mutate func(*Config)) (r *Relay, got, not *atomic.Int32) {
	t.Helper()
	var rp atomic.Pointer[Relay]
	got, not = &atomic.Int32{}, &atomic.Int32{}
	logger := slog.New(lockProbe{Handler: testLogger().Handler(), prefix: prefix, r: &rp, got: got, not: not})
	r = startRelayLogged(t, cp.Addr, logger, mutate)
	rp.Store(r)
	return r, got, not
}

// No lock is held across a callback (docs/architecture.md, "Locks"): the
// sweeper ends a guard hold that guard.hold let pass, and releases a
// rollout's change after rollout.bake, and the cache tells the relay
// (OnGuard, OnRollout), which logs it. A log handler that reads the groups
// takes Relay.mu there; were the sweeper to hold it across Sweep, that
// would deadlock.
func TestSweepCallsBackWithoutTheRelaysLock(t *testing.T) {
	t.Run("OnGuard", func(t *testing.T) {
		cp := testcp.Start(t)
		rs, names := endpoints(20)
		cp.Set(t, "c1", "1", rs...)
		r, got, not := probedRelay(t, cp, "guard: hold ended", func(c *Config) { c.Guard.Hold = 200 * time.Millisecond })
		s := subscribeAll(t, r, "n", names)
		cp.Set(t, "c1", "2") // all 20 removed: held, until guard.hold ends it
		removed := 0
		for removed < len(names) {
			removed += len(s.recvWithin(wait).GetRemovedResources())
		}
		eventually(t, "the hold's end to be logged", func() bool { return got.Load()+not.Load() > 0 })
		if not.Load() > 0 {
			t.Fatal("the sweeper held Relay.mu while the cache told it the hold ended")
		}
	})
	t.Run("OnRollout", func(t *testing.T) {
		cp := testcp.Start(t)
		cp.Set(t, "c1", "1", testcp.Endpoints("x", "127.0.0.1:1"), testcp.Endpoints("y", "127.0.0.1:1"))
		r, got, not := probedRelay(t, cp, "rollout: change released after rollout.bake", func(c *Config) {
			c.Rollout.Canary, c.Rollout.Bake = 1, 200*time.Millisecond
		})
		// The canary (the lower rank) watches x only; the other client y.
		canary, other := "client-a", "client-b"
		if compareRank(downstream.Rank(canary), downstream.Rank(other)) > 0 {
			canary, other = other, canary
		}
		subscribeAll(t, r, canary, []string{"x"})
		s := subscribeAll(t, r, other, []string{"y"})
		// y changes: no canary watches it, so it is released once the bake
		// passes, by the sweeper.
		cp.Set(t, "c1", "2", testcp.Endpoints("x", "127.0.0.1:1"), testcp.Endpoints("y", "127.0.0.1:2"))
		s.recvWithin(wait)
		eventually(t, "the release to be logged", func() bool { return got.Load()+not.Load() > 0 })
		if not.Load() > 0 {
			t.Fatal("the sweeper held Relay.mu while the cache told it the change was released")
		}
	})
}

// Where a group's load reports go is found without the relay's lock
// (docs/architecture.md, "Locks"): Relay.loadRoute reads every Cluster
// name the group wants, and warns when they come from several upstreams.
// A log handler that reads the groups takes Relay.mu at that warning; were
// the walk made under it, the handler would wait for it.
func TestLoadRouteReadsTheNamesWithoutTheRelaysLock(t *testing.T) {
	def, meshB := testcp.Start(t), testcp.Start(t)
	r, got, not := probedRelay(t, def, "the group's Clusters come from several upstreams",
		withUpstream("mesh-b", meshB.Addr, nil, []string{"mesh-b"}))
	n := lrsNode("envoy-1", "c1", "z1")
	c, leave, err := r.Join(n, downstream.Caller{Variant: "delta-ads"})
	if err != nil {
		t.Fatal(err)
	}
	defer leave()
	w := cache.NewWatch()
	if err := c.Watch(w, resourcev3.ClusterType, "c-default", "xdstp://mesh-b/envoy.config.cluster.v3.Cluster/c-b"); err != nil {
		t.Fatal(err)
	}
	defer c.Release(w)
	_, leaveLoads, err := r.JoinLoads(n, downstream.Caller{Variant: "lrs"})
	if err != nil {
		t.Fatal(err)
	}
	defer leaveLoads()
	if got.Load()+not.Load() == 0 {
		t.Fatal("no warning that the group's Clusters come from several upstreams")
	}
	if not.Load() > 0 {
		t.Fatal("Relay.loadRoute read the group's Cluster names under Relay.mu")
	}
}
