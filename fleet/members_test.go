package fleet

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"
)

// testFleet is members that ask each other in memory; a member in down
// answers nothing.
type testFleet struct {
	mu      sync.Mutex
	members map[string]*Members
	down    map[string]bool
	clients map[string]int
	ips     []string // what the peers name resolves to
}

const testTimeout = 400 * time.Millisecond

func newTestFleet(t *testing.T, addrs ...string) *testFleet {
	f := &testFleet{members: map[string]*Members{}, down: map[string]bool{}, clients: map[string]int{}}
	for _, a := range addrs {
		f.ips = append(f.ips, a[:len(a)-len(":18001")])
	}
	for _, a := range addrs {
		m, err := New(Options{
			Config:  Config{Peers: []string{"peers.test:18001"}, Self: a, Refresh: 50 * time.Millisecond, Balance: true, BalanceSlack: 0.2, ShedPerSecond: 5},
			Timeout: testTimeout,
			Ask:     f.ask,
			Clients: func() int { f.mu.Lock(); defer f.mu.Unlock(); return f.clients[a] },
			Resolve: func(context.Context, string) ([]string, error) {
				f.mu.Lock()
				defer f.mu.Unlock()
				return slices.Clone(f.ips), nil
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		f.members[a] = m
	}
	return f
}

func (f *testFleet) ask(ctx context.Context, p Peer, _ Report) (Report, error) {
	f.mu.Lock()
	m, down := f.members[p.Addr], f.down[p.Addr]
	f.mu.Unlock()
	if m == nil || down {
		<-ctx.Done() // a member that is gone answers nothing
		return Report{}, errors.New("no answer")
	}
	return m.Answer(), nil
}

func (f *testFleet) run(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, m := range f.members {
		wg.Go(func() { m.Run(ctx) })
	}
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
}

// waitView waits until member a's view is want.
func (f *testFleet) waitView(t *testing.T, a string, want []string, bound time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	deadline := start.Add(bound)
	for {
		v := f.members[a].View()
		if slices.Equal(v.Members, want) {
			return time.Since(start)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s's view is %v after %s, want %v", a, v.Members, bound, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

var three = []string{"127.0.0.1:18001", "127.0.0.2:18001", "127.0.0.3:18001"}

// Members resolved from one name see each other once they answer, agree on
// every group's owner, and a member that stops answering is out of every
// view within the timeout.
func TestMembersSeeEachOtherAndDropTheSilentWithinTheTimeout(t *testing.T) {
	f := newTestFleet(t, three...)
	f.run(t)
	for _, a := range three {
		f.waitView(t, a, three, 5*time.Second)
	}
	for i := range 50 {
		key := fmt.Sprintf("cluster=c%d", i)
		want, _ := f.members[three[0]].Owner(key)
		owners := 0
		for _, a := range three {
			o, self := f.members[a].Owner(key)
			if o != want {
				t.Fatalf("%s: %s says %s owns it, %s says %s", key, a, o, three[0], want)
			}
			if self {
				owners++
			}
		}
		if owners != 1 {
			t.Fatalf("%s has %d owners", key, owners)
		}
	}
	for _, a := range three {
		// Once each has heard the others since they agreed.
		waitFor(t, func() bool { return f.members[a].Disagreeing() == 0 })
	}
	f.mu.Lock()
	f.down[three[2]] = true
	stopped := time.Now()
	f.mu.Unlock()
	for _, a := range three[:2] {
		f.waitView(t, a, three[:2], 5*time.Second)
	}
	if took := time.Since(stopped); took > testTimeout {
		t.Fatalf("the silent member left the views %s after it stopped answering, past the timeout %s", took, testTimeout)
	}
	select {
	case <-f.members[three[0]].Changed():
	default:
		t.Fatal("the view changed and Changed was not signalled")
	}
}

// An address the name no longer resolves to leaves the view at the next
// resolution; one it newly resolves to joins once it answers; a name that
// fails to resolve keeps its last addresses.
func TestMembersFollowTheName(t *testing.T) {
	f := newTestFleet(t, three...)
	f.mu.Lock()
	f.ips = []string{"127.0.0.1", "127.0.0.2"} // the third not yet published
	f.mu.Unlock()
	f.run(t)
	f.waitView(t, three[0], three[:2], 5*time.Second)
	f.mu.Lock()
	f.ips = []string{"127.0.0.1", "127.0.0.2", "127.0.0.3"}
	f.mu.Unlock()
	f.waitView(t, three[0], three, 5*time.Second)
	f.mu.Lock()
	f.ips = []string{"127.0.0.1", "127.0.0.3"}
	f.mu.Unlock()
	f.waitView(t, three[0], []string{three[0], three[2]}, 5*time.Second)
}

func TestMembersKeepAddressesWhenTheNameFails(t *testing.T) {
	calls := 0
	m, err := New(Options{Config: Config{Peers: []string{"peers.test:18001"}, Self: "127.0.0.1:18001", Refresh: time.Millisecond},
		Timeout: time.Second, Clients: func() int { return 0 },
		Ask: func(context.Context, Peer, Report) (Report, error) { return Report{}, nil },
		Resolve: func(context.Context, string) ([]string, error) {
			calls++
			if calls > 1 {
				return nil, errors.New("SERVFAIL")
			}
			return []string{"127.0.0.2"}, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	m.Round(ctx)
	time.Sleep(2 * time.Millisecond) // past the refresh: the next round resolves again
	m.Round(ctx)
	if calls != 2 {
		t.Fatalf("resolved %d times", calls)
	}
	if v := m.View(); !slices.Equal(v.Members, []string{"127.0.0.1:18001", "127.0.0.2:18001"}) {
		t.Fatalf("view %v", v.Members)
	}
}

// Excess is what a member holds past (1+slack) times the mean of the
// live members' counts: 0 within it, alone, or with balance off.
func TestExcess(t *testing.T) {
	f := newTestFleet(t, three...)
	f.run(t)
	for _, a := range three {
		f.waitView(t, a, three, 5*time.Second)
	}
	f.mu.Lock()
	f.clients[three[1]], f.clients[three[2]] = 1500, 1500
	f.mu.Unlock()
	m := f.members[three[0]]
	waitFor(t, func() bool {
		return m.Excess(0) == 0 && m.View().Peers[0].Clients == 1500 && m.View().Peers[1].Clients == 1500
	})
	for _, tc := range []struct{ clients, want int }{
		// The mean counts this member too: (c + 3000) / 3, times 1.2.
		{0, 0}, {1000, 0}, {2000, 0}, {2500, 2500 - 2200}, {3000, 3000 - 2400},
	} {
		if got := m.Excess(tc.clients); got != tc.want {
			t.Errorf("Excess(%d) = %d, want %d", tc.clients, got, tc.want)
		}
	}
	m.opts.Balance = false
	if got := m.Excess(3000); got != 0 {
		t.Errorf("with balance off, Excess = %d", got)
	}
	alone, _ := New(Options{Config: Config{Peers: []string{"127.0.0.1:1"}, Self: "127.0.0.1:1", Refresh: time.Second, Balance: true},
		Timeout: time.Second, Clients: func() int { return 0 }, Ask: func(context.Context, Peer, Report) (Report, error) { return Report{}, nil }})
	if got := alone.Excess(1000); got != 0 {
		t.Errorf("alone, Excess = %d", got)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 5s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Bound is (1+slack) times the mean, and never below the mean rounded up
// plus one: with few clients a member may hold what some member must.
func TestBound(t *testing.T) {
	for _, tc := range []struct {
		total, n int
		slack    float64
		want     int
	}{
		{total: 4, n: 3, slack: 0.2, want: 3},     // mean 1.33: ceil 2, +1
		{total: 2, n: 3, slack: 0.2, want: 2},     // mean 0.67
		{total: 1, n: 2, slack: 0.2, want: 2},     // an idle peer
		{total: 0, n: 3, slack: 0.2, want: 1},     // nobody
		{total: 60, n: 3, slack: 0.2, want: 24},   // (1+slack) times the mean
		{total: 3000, n: 3, slack: 0, want: 1001}, // no slack: the mean, plus one
	} {
		if got := Bound(tc.total, tc.n, tc.slack); got != tc.want {
			t.Errorf("Bound(%d, %d, %v) = %d, want %d", tc.total, tc.n, tc.slack, got, tc.want)
		}
	}
}

// After a shed, Excess is 0 until every live member has answered again:
// the shed client may be on its way to one of them.
func TestExcessWaitsForFreshCountsAfterAShed(t *testing.T) {
	f := newTestFleet(t, three...)
	f.run(t)
	for _, a := range three {
		f.waitView(t, a, three, 5*time.Second)
	}
	m := f.members[three[0]]
	if got := m.Excess(100); got != 100-Bound(100, 3, 0.2) {
		t.Fatalf("Excess(100) = %d before a shed", got)
	}
	m.Shed()
	if got := m.Excess(100); got != 0 {
		t.Fatalf("Excess(100) = %d just after a shed, want 0 until the counts are fresh", got)
	}
	waitFor(t, func() bool { return m.Excess(100) > 0 })
}
