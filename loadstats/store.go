package loadstats

import (
	"errors"
	"slices"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointpb "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	lrspb "github.com/envoyproxy/go-control-plane/envoy/service/load_stats/v3"

	"github.com/xdsrelay/xdsrelay/internal/lockorder"
)

// Options configure a Store.
type Options struct {
	// Interval is lrs.interval: what clients are told to report at until
	// the control plane has answered, and whenever it names no interval.
	// Required.
	Interval time.Duration
	// MinInterval is lrs.min_interval: a control plane's interval below it
	// is raised to it (OnClamped), for clients and for the relay's own
	// periods alike. Required, at most Interval.
	MinInterval time.Duration
	// MaxPending is lrs.max_pending: the periods (Cut) held while they
	// cannot be delivered; past it the oldest is dropped. Required.
	MaxPending int
	// MaxPendingBytes is lrs.max_pending_bytes: the encoded size of the
	// periods held; past it they are merged into one, or, if that is
	// still past it, the oldest are dropped (OnDropped, OnDroppedStats
	// with ReasonMaxPendingBytes). Required.
	MaxPendingBytes int
	// MaxNames is lrs.max_names: the distinct names (clusters, localities,
	// endpoints, named metrics, drop categories) a period holds, and the
	// gauges held; stats past it are left out (OnDroppedStats,
	// ReasonMaxNames). Required.
	MaxNames int
	// ByLocality tells that the group's key holds a locality field: its
	// clients are all in one zone, and the zone check is off.
	ByLocality bool
	// OnMixedZones is called, once, when two clients of the group report
	// from different zones (see ByLocality), with the two localities.
	OnMixedZones func(first, other *corepb.Locality)
	// OnIgnored counts cluster stats left out: of a report, for a cluster
	// the client was not told to report or the control plane no longer
	// asks for; of a period, for a cluster the control plane stopped
	// asking for within it.
	OnIgnored func(n int)
	// OnDropped counts periods dropped undelivered: past MaxPending or
	// MaxPendingBytes, or discarded with the store.
	OnDropped func(n int)
	// OnDroppedStats counts stats left out of the sums, by reason (one of
	// the Reason constants).
	OnDroppedStats func(reason string, n int)
	// OnClamped is called when the control plane asks for an interval
	// below MinInterval, with what it asked.
	OnClamped func(asked time.Duration)
	// OnSaturated counts sums held at their largest value (2^64-1, or the
	// largest double) where they would have wrapped or been infinite.
	OnSaturated func(n int)
}

// Why stats are left out of the sums (Options.OnDroppedStats); the values
// of the reason label of xdsrelay_lrs_dropped_stats_total.
const (
	// ReasonMaxNames: a stat that would have added a name past MaxNames.
	ReasonMaxNames = "max_names"
	// ReasonInvalidValue: a load metric whose total is NaN, infinite or
	// negative.
	ReasonInvalidValue = "invalid_value"
	// ReasonMaxPendingBytes: the cluster stats of periods held
	// undelivered, dropped past MaxPendingBytes.
	ReasonMaxPendingBytes = "max_pending_bytes"
	// ReasonSendBlocked: the cluster stats of the report last written on a
	// stream to the control plane whose next send did not return within
	// lrs.send_timeout (never read, lost with the stream); the upstream's
	// reporter counts them, the store never sees them.
	ReasonSendBlocked = "send_blocked"
)

// Store is one group's load reports and the control plane's instructions.
type Store struct {
	// Read-only after New.
	opts Options

	mu        lockorder.Mutex[storeMu]
	cur       *told                   // guarded by mu: what clients are told now
	answered  bool                    // guarded by mu: the control plane has instructed
	reporters map[*Reporter]struct{}  // guarded by mu
	left      time.Time               // guarded by mu: when the last reporter left; zero while any is joined
	sums      *sums                   // guarded by mu: the current period's counts
	gauges    map[gaugeKey]gaugeEntry // guarded by mu: the sum of every reporter's latest gauges
	start     time.Time               // guarded by mu: when the current period began
	pending   []period                // guarded by mu: periods not delivered, oldest first (pending.go)
	zone      *corepb.Locality        // guarded by mu: the first reporter's, for the zone check
	mixed     bool                    // guarded by mu: OnMixedZones was called
}

// New returns an empty store whose clients are told, until Instruct, to
// report every cluster at opts.Interval.
func New(opts Options) (*Store, error) {
	switch {
	case opts.Interval <= 0:
		return nil, errors.New("loadstats: Options.Interval must be positive")
	case opts.MinInterval <= 0 || opts.MinInterval > opts.Interval:
		return nil, errors.New("loadstats: Options.MinInterval must be positive, and at most Interval")
	case opts.MaxPending <= 0:
		return nil, errors.New("loadstats: Options.MaxPending must be positive")
	case opts.MaxNames <= 0:
		return nil, errors.New("loadstats: Options.MaxNames must be positive")
	case opts.MaxPendingBytes <= 0:
		return nil, errors.New("loadstats: Options.MaxPendingBytes must be positive")
	}
	for _, f := range []*func(int){&opts.OnIgnored, &opts.OnDropped, &opts.OnSaturated} {
		if *f == nil {
			*f = func(int) {}
		}
	}
	if opts.OnClamped == nil {
		opts.OnClamped = func(time.Duration) {}
	}
	if opts.OnDroppedStats == nil {
		opts.OnDroppedStats = func(string, int) {}
	}
	return &Store{
		opts:      opts,
		cur:       newTold(Instructions{SendAll: true, Interval: opts.Interval}, 1),
		reporters: map[*Reporter]struct{}{},
		left:      time.Now(),
		sums:      newSums(opts.MaxNames),
		gauges:    map[gaugeKey]gaugeEntry{},
		start:     time.Now(),
	}, nil
}

// Reporter is one client stream's place in the store.
type Reporter struct {
	// Read-only after Join.
	s      *Store
	notify func()

	// Guarded by s.mu.
	told   *told        // what the client was told last; nil before Next
	latest []gaugeEntry // the gauges of its latest report
	gone   bool         // Leave was called
}

// Join adds a reporting client, whose stream's first request carried node.
// notify is called (never with the store's lock held) whenever the client
// has something new to be told: read it with Next.
func (s *Store) Join(node *corepb.Node, notify func()) *Reporter {
	r := &Reporter{s: s, notify: notify}
	s.mu.Lock()
	s.reporters[r] = struct{}{}
	s.left = time.Time{}
	first, other := s.checkZoneLocked(node.GetLocality())
	s.mu.Unlock()
	if other != nil && s.opts.OnMixedZones != nil {
		s.opts.OnMixedZones(first, other)
	}
	return r
}

// checkZoneLocked notes the locality of a new reporter, and returns the
// first one and this one the first time two differ in region or zone.
func (s *Store) checkZoneLocked(l *corepb.Locality) (first, other *corepb.Locality) {
	if s.opts.ByLocality || s.mixed {
		return nil, nil
	}
	if s.zone == nil {
		s.zone = &corepb.Locality{Region: l.GetRegion(), Zone: l.GetZone()}
		return nil, nil
	}
	if s.zone.GetRegion() == l.GetRegion() && s.zone.GetZone() == l.GetZone() {
		return nil, nil
	}
	s.mixed = true
	return s.zone, &corepb.Locality{Region: l.GetRegion(), Zone: l.GetZone()}
}

// Leave removes the reporter: its gauges leave the sums, its counts stay.
func (r *Reporter) Leave() {
	s := r.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if r.gone {
		return
	}
	r.gone = true
	s.replaceGaugesLocked(r.latest, nil)
	r.latest = nil
	delete(s.reporters, r)
	if len(s.reporters) == 0 {
		s.left = time.Now()
	}
}

// Next returns what the client is to be told, nil if it was told it
// already; the client counts as told once it is returned.
func (r *Reporter) Next() *lrspb.LoadStatsResponse {
	s := r.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if r.told == s.cur {
		return nil
	}
	r.told = s.cur
	return s.cur.resp
}

// Report adds a client's report. Stats for a cluster the client was not
// told to report, or that the control plane no longer asks for, are left
// out and counted (OnIgnored); so are stats past Options.MaxNames and
// load metrics that are not a number, infinite or negative
// (OnDroppedStats), the rest of the report kept. The report's gauges
// replace the client's previous ones whole: a locality or cluster it
// leaves out has none. It returns what of the report it left out past a
// bound or as invalid, for the client's stream to say once.
func (r *Reporter) Report(stats []*endpointpb.ClusterStats) Refused {
	s := r.s
	ignored := 0
	s.mu.Lock()
	if r.gone {
		s.mu.Unlock()
		return Refused{}
	}
	var latest []gaugeEntry
	endpoints := s.cur.in.EndpointGranularity
	for _, cs := range stats {
		if name := cs.GetClusterName(); !r.told.wants(name) || !s.cur.wants(name) {
			ignored++
			continue
		}
		s.sums.add(cs, endpoints)
		latest = gaugesOf(latest, cs, endpoints)
	}
	latest = slices.DeleteFunc(latest, func(e gaugeEntry) bool { return !s.sums.has(e.key) })
	r.latest = s.replaceGaugesLocked(r.latest, latest)
	t := s.sums.t
	s.sums.t = tally{}
	s.mu.Unlock()
	if ignored > 0 {
		s.opts.OnIgnored(ignored)
	}
	s.count(t)
	return Refused{MaxNames: t.refused, InvalidValues: t.invalid}
}

// Refused is what a report had left out (Report): stats past
// Options.MaxNames, load metrics that are not a number, infinite or
// negative.
type Refused struct{ MaxNames, InvalidValues int }

// Any reports whether anything was left out.
func (r Refused) Any() bool { return r != Refused{} }

// count passes a tally on to the store's callbacks; never with the lock
// held.
func (s *Store) count(t tally) {
	if t.refused > 0 {
		s.opts.OnDroppedStats(ReasonMaxNames, t.refused)
	}
	if t.invalid > 0 {
		s.opts.OnDroppedStats(ReasonInvalidValue, t.invalid)
	}
	if t.saturated > 0 {
		s.opts.OnSaturated(t.saturated)
	}
}

// replaceGaugesLocked takes old out of the gauges' sums and puts latest
// in, and returns what of latest it took: a gauge at a place new to the
// gauges, past Options.MaxNames of them, is left out (counted in the
// period's tally).
func (s *Store) replaceGaugesLocked(old, latest []gaugeEntry) []gaugeEntry {
	for _, e := range old {
		sum := s.gauges[e.key]
		if sum.g = sum.g.minus(e.g); sum.g.zero() {
			delete(s.gauges, e.key)
		} else {
			s.gauges[e.key] = sum
		}
	}
	return slices.DeleteFunc(latest, func(e gaugeEntry) bool {
		sum, ok := s.gauges[e.key]
		if !ok && len(s.gauges) >= s.opts.MaxNames {
			s.sums.t.refused++
			return true
		}
		sum.key, sum.g = e.key, sum.g.plus(e.g)
		if e.ep != nil {
			sum.ep = e.ep // the latest address and metadata
		}
		s.gauges[e.key] = sum
		return false
	})
}

// Instruct records what the control plane asked for, and tells every
// reporter if it changed (see Next). It reports whether it changed. An
// interval below Options.MinInterval is raised to it (OnClamped): one of
// 1 ns would have clients report, and the relay cut periods, without
// pause.
func (s *Store) Instruct(in Instructions) bool {
	asked := in.Interval
	in, clamped := in.normal(s.opts.Interval, s.opts.MinInterval)
	if clamped {
		s.opts.OnClamped(asked)
	}
	s.mu.Lock()
	s.answered = true
	if s.cur.in.equal(in) {
		s.mu.Unlock()
		return false
	}
	s.cur = newTold(in, s.cur.version+1)
	notify := make([]func(), 0, len(s.reporters))
	for r := range s.reporters {
		notify = append(notify, r.notify)
	}
	s.mu.Unlock()
	for _, f := range notify {
		f()
	}
	return true
}

// Instructions returns what clients are told now.
func (s *Store) Instructions() Instructions {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur.in
}

// Cut ends the current period at now: its counts and the gauges as they
// stand become a pending period, ready to send (Pending), and a new period
// begins. The pending periods are then kept within Options.MaxPending and
// Options.MaxPendingBytes (boundLocked).
func (s *Store) Cut(now time.Time) {
	s.mu.Lock()
	for _, e := range s.gauges {
		s.sums.fold(e)
	}
	stats, left := s.sums.build(s.cur.wants, now.Sub(s.start), s.cur.in.EndpointGranularity)
	t := s.sums.t
	s.sums = newSums(s.opts.MaxNames)
	s.pending = append(s.pending, encodePeriod(s.start, now, 1, stats))
	s.start = now
	d := s.boundLocked()
	s.mu.Unlock()
	if left > 0 {
		s.opts.OnIgnored(left)
	}
	d.count(s)
	s.count(t)
}

// Idle reports whether no client reports, and since when.
func (s *Store) Idle() (since time.Time, idle bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.left, len(s.reporters) == 0
}

// Status is what the admin endpoint shows of a store.
type Status struct {
	Reporters    int          // clients reporting
	Pending      int          // periods not delivered
	PendingBytes int          // their encoded size (Options.MaxPendingBytes)
	Answered     bool         // the control plane has instructed (Instruct)
	Instructions Instructions // what clients are told now
}

// Status returns the store's status.
func (s *Store) Status() Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	periods, bytes := heldSize(s.pending)
	return Status{Reporters: len(s.reporters), Pending: periods, PendingBytes: bytes, Answered: s.answered, Instructions: s.cur.in}
}
