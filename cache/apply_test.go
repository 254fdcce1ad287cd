package cache

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Readers racing one writer only ever see whole upstream responses: every
// response sets all names to one version and errors one of them, and every
// view holds one version of all of them with that version's error.
func TestReadersSeeWholeResponses(t *testing.T) {
	const names = 50
	c := New(Options{Retention: time.Minute})
	w := NewWatch()
	c.WatchWildcard(w, eds)
	response := func(k int) Change {
		v := strconv.Itoa(k)
		ch := Change{Synced: true}
		for i := range names {
			ch.Upserts = append(ch.Upserts, res(fmt.Sprintf("r%02d", i), v))
		}
		// Every other response also removes the last name and errors the first.
		if k%2 == 1 {
			ch.Upserts = ch.Upserts[:names-1]
			ch.Removed = []string{fmt.Sprintf("r%02d", names-1)}
			ch.Errors = []*ResourceError{{Name: "r00", Delta: []byte(v), SotW: []byte(v)}}
		}
		return ch
	}
	c.Apply(eds, response(0))

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Go(func() {
			var last uint64
			for ctx.Err() == nil {
				if err := checkWhole(c.Read(eds, []string{"r00"}, true), names, &last); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	for k := 1; k <= 2000 && ctx.Err() == nil; k++ {
		c.Apply(eds, response(k))
	}
	cancel()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

func checkWhole(v View, names int, last *uint64) error {
	if v.Version < *last {
		return fmt.Errorf("version went back from %d to %d", *last, v.Version)
	}
	*last = v.Version
	var version string
	present := 0
	for _, l := range v.Lookups {
		if l.Resource == nil {
			continue
		}
		present++
		if version == "" {
			version = l.Resource.Version
		} else if l.Resource.Version != version {
			return fmt.Errorf("view at %d mixes versions %s and %s", v.Version, version, l.Resource.Version)
		}
	}
	k, _ := strconv.Atoi(version)
	odd := k%2 == 1
	switch {
	case odd && present != names-1, !odd && present != names:
		return fmt.Errorf("view of response %s holds %d resources", version, present)
	case odd && (v.Lookups[0].Error == nil || string(v.Lookups[0].Error.Delta) != version):
		return fmt.Errorf("view of response %s lacks its error: %+v", version, v.Lookups[0].Error)
	case !odd && v.Lookups[0].Error != nil:
		return fmt.Errorf("view of response %s has a stale error %s", version, v.Lookups[0].Error.Delta)
	}
	return nil
}

// One upstream response is one new version and one mark per watcher,
// however much it holds.
func TestApplyIsOneVersion(t *testing.T) {
	c := New(Options{Retention: time.Minute})
	a, wc := NewWatch(), NewWatch()
	c.Watch(a, eds, "x", "y")
	c.WatchWildcard(wc, eds)
	before := c.Version(eds)
	c.Apply(eds, Change{
		Upserts:    []*Resource{res("x", "1"), res("y", "1")},
		Removed:    []string{"z"},
		Heartbeats: []*Heartbeat{{Name: "x", Version: "1"}},
		Errors:     []*ResourceError{{Name: "y"}},
		Synced:     true,
	})
	if got := c.Version(eds) - before; got != 1 {
		t.Errorf("one response made %d versions", got)
	}
	d := a.Take().Of(eds)
	if d == nil || d.Names.Len() != 2 || d.Heartbeats.Len() != 1 {
		t.Errorf("watcher of x and y: %+v", d)
	}
	if !c.Read(eds, nil, false).Synced {
		t.Error("not synced after a response that answered the wildcard")
	}
	// Nothing new: no new version, no generation change.
	gen := c.Generation()
	c.Apply(eds, Change{Upserts: []*Resource{res("x", "1")}})
	if c.Version(eds) != before+1 || c.Generation() != gen {
		t.Errorf("an unchanged response moved the version or the generation")
	}
}

// Expiry, upstream removal, eviction and sweeping go one way: each drops
// the resource's aliases, error and heartbeat with it.
func TestRemovalDropsAliasesAndErrors(t *testing.T) {
	const vhds = "type.googleapis.com/envoy.config.route.v3.VirtualHost"
	clk := &clock{t: time.Unix(1000, 0)}
	c := New(Options{Retention: time.Minute, Now: clk.now})
	w := NewWatch()
	c.Watch(w, vhds, "vh", "alias")
	r := res("vh", "1")
	r.Aliases, r.TTL = []string{"alias"}, time.Second
	c.Apply(vhds, Change{Upserts: []*Resource{r}, Errors: []*ResourceError{{Name: "vh"}}})
	if l := c.Get(vhds, []string{"alias"})[0]; l.Resource != r {
		t.Fatalf("alias does not resolve: %+v", l)
	}
	w.Take()
	clk.t = clk.t.Add(2 * time.Second) // the TTL runs out
	c.Sweep()
	l := c.Get(vhds, []string{"vh", "alias"})
	if l[0].Resource != nil || !l[0].Absent || l[0].Error != nil {
		t.Errorf("expired resource: %+v", l[0])
	}
	if l[1].Resource != nil {
		t.Errorf("alias still resolves after expiry: %+v", l[1])
	}
	if d := w.Take().Of(vhds); d == nil || d.Names.Len() != 2 {
		t.Errorf("watchers of the name and the alias were not both marked: %+v", d)
	}
}

// A restored cache resolves aliases as the live one did.
func TestImportRestoresAliases(t *testing.T) {
	const vhds = "type.googleapis.com/envoy.config.route.v3.VirtualHost"
	r := res("vh", "1")
	r.Aliases = []string{"alias"}
	c := New(Options{Retention: time.Minute})
	c.Import([]TypeState{{TypeURL: vhds, Resources: []*Resource{r}}})
	if l := c.Get(vhds, []string{"alias"})[0]; l.Resource != r {
		t.Fatalf("alias of a restored resource: %+v", l)
	}
}

// The interest log says what entered and left the interest since it was
// last taken, and overflows to "read it all" rather than grow without bound.
func TestInterestChanges(t *testing.T) {
	clk := &clock{t: time.Unix(1000, 0)}
	c := New(Options{Retention: time.Minute, Now: clk.now})
	w := NewWatch()
	c.Watch(w, eds, "a", "b")
	c.WatchWildcard(w, eds)
	changes, all := c.InterestChanges()
	if all || !changes[eds]["a"] || !changes[eds]["b"] || !changes[eds]["*"] {
		t.Fatalf("after watching: %v %v", changes, all)
	}
	if changes, _ := c.InterestChanges(); len(changes) != 0 {
		t.Fatalf("taken twice: %v", changes)
	}
	c.Unwatch(w, eds, "a")
	clk.t = clk.t.Add(2 * time.Minute)
	c.Sweep() // a's retention ends
	if changes, _ := c.InterestChanges(); len(changes[eds]) != 1 || changes[eds]["a"] {
		t.Fatalf("after a's retention: %v", changes)
	}
	for i := range maxInterestLog + 1 {
		c.Watch(w, eds, strconv.Itoa(i))
	}
	if changes, all := c.InterestChanges(); !all || changes != nil {
		t.Fatalf("past the bound: %d types, all=%v", len(changes), all)
	}
}

// A type keeps the receipt time and trace of the latest response that
// changed it, for the push latency and the push spans; a response that
// changes nothing leaves them.
func TestApplyKeepsReceipt(t *testing.T) {
	c := New(Options{Retention: time.Minute})
	w := NewWatch()
	c.WatchWildcard(w, eds)
	t0 := time.Unix(1000, 0)
	tr := Trace{TraceID: [16]byte{1}, SpanID: [8]byte{2}, Sampled: true}
	c.Apply(eds, Change{Upserts: []*Resource{res("x", "1")}, Synced: true, Received: t0, Trace: tr})
	if v := c.Read(eds, nil, true); !v.Received.Equal(t0) || v.Trace != tr {
		t.Errorf("View.Received = %v, Trace = %v, want %v and %v", v.Received, v.Trace, t0, tr)
	}
	c.Apply(eds, Change{Upserts: []*Resource{res("x", "1")}, Received: t0.Add(time.Second), Trace: Trace{SpanID: [8]byte{3}}})
	if st := c.State(eds); !st.Received.Equal(t0) || st.Trace != tr {
		t.Errorf("after an unchanged response, State.Received = %v, Trace = %v, want %v and %v", st.Received, st.Trace, t0, tr)
	}
	// A heartbeat refreshes a TTL; it is not a change of the type.
	c.Apply(eds, Change{Heartbeats: []*Heartbeat{{Name: "x", Version: "1"}}, Received: t0.Add(2 * time.Second), Trace: Trace{SpanID: [8]byte{4}}})
	if v := c.Read(eds, nil, true); !v.Received.Equal(t0) || v.Trace != tr {
		t.Errorf("after a heartbeat, View.Received = %v, Trace = %v, want %v and %v", v.Received, v.Trace, t0, tr)
	}
}

// A name taken not to exist on a word withdrawn is missing again: neither
// present nor absent, and without its error; a present one is untouched.
func TestApplyUnknown(t *testing.T) {
	c := New(Options{})
	w := NewWatch()
	if err := c.Watch(w, "t", "gone", "here"); err != nil {
		t.Fatal(err)
	}
	c.Apply("t", Change{Upserts: []*Resource{{Name: "here", Version: "1"}}, Removed: []string{"gone"},
		Errors: []*ResourceError{{Name: "gone", Code: 5}}})
	if l := c.Get("t", []string{"gone"})[0]; !l.Absent || l.Error == nil {
		t.Fatalf("before: %+v", l)
	}
	c.Apply("t", Change{Unknown: []string{"gone", "here", "never-watched"}})
	if l := c.Get("t", []string{"gone"})[0]; l.Absent || l.Resource != nil || l.Error != nil {
		t.Errorf("gone after the withdrawal: %+v", l)
	}
	if l := c.Get("t", []string{"here"})[0]; l.Resource == nil {
		t.Errorf("a present resource was touched: %+v", l)
	}
}

// While the generation stays, what Get, Interest and Synced answer stays:
// a reader that derives something from the whole interest may keep it
// until the generation moves (upstream's Client.missing). Random watches,
// responses, judgments taken back and sweeps, each followed by a look.
func TestGenerationMovesWithWhatReadersSee(t *testing.T) {
	clk := &clock{t: time.Unix(1000, 0)}
	c := New(Options{Retention: time.Minute, Now: clk.now})
	rng := rand.New(rand.NewPCG(1, 2))
	names := []string{"a", "b", "c", "d", "e", "f"}
	some := func() []string {
		var out []string
		for _, n := range names {
			if rng.IntN(3) == 0 {
				out = append(out, n)
			}
		}
		return out
	}
	ws := []*Watch{NewWatch(), NewWatch(), NewWatch()}
	look := func() string {
		var b strings.Builder
		fmt.Fprintf(&b, "%v synced=%v\n", c.Interest(), c.Synced(eds))
		for _, l := range c.Get(eds, names) {
			v := ""
			if l.Resource != nil {
				v = l.Resource.Version
			}
			fmt.Fprintf(&b, "%s %q absent=%v referenced=%v waiting=%v err=%v\n", l.Name, v, l.Absent, l.Referenced, l.Waiting, l.Error != nil)
		}
		return b.String()
	}
	ops := []func() string{
		func() string {
			w := ws[rng.IntN(3)]
			n := some()
			c.Watch(w, eds, n...)
			return fmt.Sprint("watch ", n)
		},
		func() string {
			w := ws[rng.IntN(3)]
			n := some()
			c.Unwatch(w, eds, n...)
			return fmt.Sprint("unwatch ", n)
		},
		func() string { c.WatchWildcard(ws[rng.IntN(3)], eds); return "wildcard" },
		func() string { c.UnwatchWildcard(ws[rng.IntN(3)], eds); return "no wildcard" },
		func() string {
			var ups []*Resource
			for _, n := range some() {
				ups = append(ups, res(n, strconv.Itoa(rng.IntN(3))))
			}
			ch := Change{Upserts: ups, Removed: some(), Synced: rng.IntN(2) == 0}
			c.Apply(eds, ch)
			return fmt.Sprintf("apply %d upserts, removed %v, synced %v", len(ups), ch.Removed, ch.Synced)
		},
		func() string { n := some(); c.Apply(eds, Change{Unknown: n}); return fmt.Sprint("unknown ", n) },
		func() string {
			n := some()
			var errs []*ResourceError
			for _, x := range n {
				errs = append(errs, &ResourceError{Name: x})
			}
			c.Apply(eds, Change{Errors: errs})
			return fmt.Sprint("errors ", n)
		},
		func() string { clk.t = clk.t.Add(time.Duration(rng.IntN(90)) * time.Second); c.Sweep(); return "sweep" },
	}
	before, gen := look(), c.Generation()
	for i := range 5000 {
		what := ops[rng.IntN(len(ops))]()
		after, g := look(), c.Generation()
		if g == gen && after != before {
			t.Fatalf("step %d, %s: the generation stayed at %d, and what readers see changed:\n%s→\n%s", i, what, g, before, after)
		}
		before, gen = after, g
	}
}
