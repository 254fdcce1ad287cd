package loadstats

import (
	"time"

	endpointpb "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	lrspb "github.com/envoyproxy/go-control-plane/envoy/service/load_stats/v3"
	"google.golang.org/protobuf/proto"
)

// period is the stats of one period, [from, to), or of several merged,
// ready to send. It is held encoded: a period's messages take about five
// times their encoded size in memory (BENCHMARKS.md), and a held period is
// read only when it is sent or merged.
type period struct {
	from, to time.Time
	periods  int    // the periods (Cut) it holds: more than one once merged
	clusters int    // its cluster stats
	encoded  []byte // its stats, as a LoadStatsRequest's cluster_stats
}

// encodePeriod holds stats as a period. The stats were decoded from
// clients' requests by gRPC, so that they encode (a string that is not
// UTF-8 would not have been decoded); were one not to, its period would
// hold nothing.
func encodePeriod(from, to time.Time, periods int, stats []*endpointpb.ClusterStats) period {
	b, err := proto.Marshal(&lrspb.LoadStatsRequest{ClusterStats: stats})
	if err != nil {
		b = nil
	}
	return period{from: from, to: to, periods: periods, clusters: len(stats), encoded: b}
}

// stats decodes the period's stats: fresh messages, the caller's own.
func (p period) stats() []*endpointpb.ClusterStats {
	var req lrspb.LoadStatsRequest
	if proto.Unmarshal(p.encoded, &req) != nil {
		return nil // it was encoded here
	}
	return req.ClusterStats
}

// mergePeriods merges held periods, oldest first, into one report: their
// counts summed, the latest one's gauges, over the time from the first
// one's start to the last one's end. Its tally counts the sums held at
// their edge.
func mergePeriods(ps []period) (stats []*endpointpb.ClusterStats, t tally) {
	if len(ps) == 1 {
		return ps[0].stats(), t
	}
	merged := newSums(0)
	var last []*endpointpb.ClusterStats
	for _, p := range ps {
		last = p.stats()
		for _, cs := range last {
			merged.add(cs, true)
		}
	}
	var latest []gaugeEntry
	for _, cs := range last {
		latest = gaugesOf(latest, cs, true)
	}
	for _, e := range latest {
		merged.fold(e)
	}
	stats, _ = merged.build(nil, ps[len(ps)-1].to.Sub(ps[0].from), true)
	return stats, merged.t
}

// heldSize is the periods that ps hold and their encoded size.
func heldSize(ps []period) (periods, bytes int) {
	for _, p := range ps {
		periods += p.periods
		bytes += len(p.encoded)
	}
	return periods, bytes
}

// dropped is what boundLocked dropped, to count once the lock is released.
type dropped struct {
	periods  int // periods, past MaxPending or MaxPendingBytes (OnDropped)
	clusters int // their cluster stats, past MaxPendingBytes (ReasonMaxPendingBytes)
	t        tally
}

func (d dropped) count(s *Store) {
	if d.periods > 0 {
		s.opts.OnDropped(d.periods)
	}
	if d.clusters > 0 {
		s.opts.OnDroppedStats(ReasonMaxPendingBytes, d.clusters)
	}
	s.count(d.t)
}

// boundLocked keeps the pending periods within the store's bounds, the
// newest always kept. Past Options.MaxPending periods, the oldest are
// dropped. Past Options.MaxPendingBytes, they are merged into one if that
// fits (a group names mostly the same clusters every period, so that a
// merged outage costs about one period); if not, the oldest are dropped
// until the rest fits. The work is the held bytes', bounded.
func (s *Store) boundLocked() (d dropped) {
	drop := func(k int, bytes bool) {
		if k == 0 {
			return
		}
		for _, p := range s.pending[:k] {
			d.periods += p.periods
			if bytes {
				d.clusters += p.clusters
			}
		}
		s.pending = held(s.pending[k:])
	}
	periods, bytes := heldSize(s.pending)
	k := 0
	for ; periods > s.opts.MaxPending && k < len(s.pending)-1; k++ {
		periods -= s.pending[k].periods
	}
	drop(k, false)
	if _, bytes = heldSize(s.pending); bytes <= s.opts.MaxPendingBytes || len(s.pending) == 1 {
		return d
	}
	stats, t := mergePeriods(s.pending)
	d.t = t
	if m := encodePeriod(s.pending[0].from, s.pending[len(s.pending)-1].to, periods, stats); len(m.encoded) <= s.opts.MaxPendingBytes {
		s.pending = []period{m}
		return d
	}
	for k = 0; bytes > s.opts.MaxPendingBytes && k < len(s.pending)-1; k++ {
		bytes -= len(s.pending[k].encoded)
	}
	drop(k, true)
	return d
}

// Pending returns the held reports not delivered yet as one report
// (mergePeriods): over the real time since the last report delivered,
// unless periods were dropped. The stats are the caller's own. n is how
// many held reports it merges: pass it to Delivered once the report is
// sent.
func (s *Store) Pending() (stats []*endpointpb.ClusterStats, n int) {
	s.mu.Lock()
	n = len(s.pending)
	if n == 0 {
		s.mu.Unlock()
		return nil, 0
	}
	stats, t := mergePeriods(s.pending)
	s.mu.Unlock()
	s.count(t)
	return stats, n
}

// Delivered removes the n oldest held reports, sent, but for unsent: the
// stats of a report sent in parts whose send failed part way. Those stay
// pending, as one report over the same time, so that nothing is sent
// twice and nothing is lost.
func (s *Store) Delivered(n int, unsent []*endpointpb.ClusterStats) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n = min(n, len(s.pending))
	if n == 0 {
		return
	}
	rest := s.pending[n:]
	if len(unsent) > 0 {
		periods, _ := heldSize(s.pending[:n])
		rest = append([]period{encodePeriod(s.pending[0].from, s.pending[n-1].to, periods, unsent)}, rest...)
	}
	s.pending = held(rest)
}

// held returns a copy of rest on an array of its own, nil if rest is empty:
// what is delivered or dropped must leave memory at once, and a slice
// that keeps the old array (rest[:0:0], slices.Clone of an empty slice)
// keeps every period in it.
func held(rest []period) []period {
	if len(rest) == 0 {
		return nil
	}
	return append([]period(nil), rest...)
}

// Discard drops what the store holds undelivered, when its group ends: the
// pending periods (counted, OnDropped) and the current one's counts.
func (s *Store) Discard() {
	s.mu.Lock()
	n, _ := heldSize(s.pending)
	s.pending, s.sums = nil, newSums(s.opts.MaxNames)
	s.mu.Unlock()
	if n > 0 {
		s.opts.OnDropped(n)
	}
}
