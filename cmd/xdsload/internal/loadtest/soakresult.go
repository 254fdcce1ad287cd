package loadtest

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// Soak is what a soak (Config.Soak) measured: a row every Every, whether
// each figure stayed within 10% of its reference, and how the clients
// ended.
type Soak struct {
	Rows []SoakRow `json:"rows"`
	// Reference is when the figures are taken as settled (5m, or half a
	// soak shorter than 10m); each figure is held, from the first row at
	// or after it, to its value in that row. ReferenceRule says so.
	Reference     time.Duration `json:"reference_ns"`
	ReferenceRule string        `json:"reference_rule"`
	Verdicts      []SoakVerdict `json:"verdicts"`
	// Ending is how the clients ended, once the changes stopped; Ended
	// tells whether they were looked at (not if the soak stopped early).
	Ending Ending `json:"ending"`
	Ended  bool   `json:"ended"`
	// Passed: every gated figure within 10%, and every client ended at
	// the last versions, told of no removal.
	Passed bool `json:"passed"`

	// Counts over the soak.
	Changes  int64 `json:"changes"`  // resources changed by the control plane
	Restarts int64 `json:"restarts"` // of the control plane
	// With Faults, the link between the relay and its control plane went
	// silent, trickled and was reset so many times.
	Silences int64 `json:"silences,omitempty"`
	Trickles int64 `json:"trickles,omitempty"`
	Resets   int64 `json:"resets,omitempty"`
	// Faults are the faults over (restarts included), in order.
	Faults         []SoakFault `json:"faults,omitempty"`
	Reconnects     int64       `json:"reconnects"`
	Resubscribes   int64       `json:"resubscribes"`
	Responses      int64       `json:"responses"`
	NACKs          int64       `json:"nacks"`
	StreamFailures int64       `json:"stream_failures"` // streams that failed or were refused, then retried
	FirstError     string      `json:"first_error,omitempty"`

	printed bool // the header and rows went to SoakConfig.Rows
}

// SoakRow is the relay at Elapsed into the soak, and the fan-out of the
// updates the clients received since the row before.
type SoakRow struct {
	Elapsed time.Duration `json:"elapsed_ns"`
	RelaySample
	FanOutP50 time.Duration `json:"fan_out_p50_ns"` // over every receipt in the interval
	Receipts  int           `json:"receipts"`
}

// SoakVerdict is how one figure fared after the reference.
type SoakVerdict struct {
	Figure    string        `json:"figure"`
	At        time.Duration `json:"at_ns"` // the reference row's Elapsed
	Reference float64       `json:"reference"`
	Min       float64       `json:"min"` // over the rows after the reference
	Max       float64       `json:"max"`
	Final     float64       `json:"final"`
	Change    float64       `json:"max_change"` // largest |value-reference|/reference
	Rows      int           `json:"rows"`       // compared; 0: nothing to judge
	Within    bool          `json:"within"`
	Gated     bool          `json:"gated"`
}

// soakFigure reads one figure of a row; ok is false where the row has none
// (no receipt in its interval).
func soakFigure(r SoakRow, figure string) (v float64, ok bool) {
	switch figure {
	case FigureRSS:
		return float64(r.RSS), true
	case FigureHeap:
		return float64(r.HeapAlloc), true
	case FigureGoroutines:
		return float64(r.Goroutines), true
	case FigureFDs:
		return float64(r.FDs), true
	case FigureStreams:
		return float64(r.Streams), true
	}
	return float64(r.FanOutP50), r.Receipts > 0
}

// soakReference is when a soak of d is taken as settled, and how to say so.
func soakReference(d time.Duration) (time.Duration, string) {
	if d < soakLong {
		return d / 2, fmt.Sprintf("its value after the first half (%s; the soak is shorter than %s, so not after the first %s)", d/2, soakLong, soakSettle)
	}
	return soakSettle, fmt.Sprintf("its value after the first %s", soakSettle)
}

// judge holds every figure to its reference, and sets Passed from that
// and the ending.
func (sk *Soak) judge(s *SoakConfig) {
	sk.Reference, sk.ReferenceRule = soakReference(s.Duration)
	sk.Verdicts, sk.Passed = nil, true
	for _, f := range SoakFigures {
		v := judgeFigure(sk.Rows, f, sk.Reference)
		v.Gated = slices.Contains(s.Gate, f)
		if v.Gated && !v.Within {
			sk.Passed = false
		}
		sk.Verdicts = append(sk.Verdicts, v)
	}
	if sk.Ended && !sk.Ending.ok() {
		sk.Passed = false
	}
}

// failures says why the soak did not pass.
func (sk *Soak) failures() []string {
	var out []string
	if f := sk.failed(); len(f) > 0 {
		out = append(out, fmt.Sprintf("%s did not stay within %.0f%% of %s", strings.Join(f, ", "), soakTolerance*100, sk.ReferenceRule))
	}
	if sk.Ended {
		out = append(out, sk.Ending.failures()...)
	}
	return out
}

// judgeFigure compares figure in the rows after the reference row (the
// first at or after ref that has the figure) with it there.
func judgeFigure(rows []SoakRow, figure string, ref time.Duration) SoakVerdict {
	v := SoakVerdict{Figure: figure, Within: true, Min: math.Inf(1), Max: math.Inf(-1)}
	k := slices.IndexFunc(rows, func(r SoakRow) bool {
		_, ok := soakFigure(r, figure)
		return ok && r.Elapsed >= ref
	})
	if k < 0 {
		v.Min, v.Max = 0, 0
		return v
	}
	v.At = rows[k].Elapsed
	v.Reference, _ = soakFigure(rows[k], figure)
	for _, r := range rows[k+1:] {
		x, ok := soakFigure(r, figure)
		if !ok {
			continue
		}
		v.Rows++
		v.Min, v.Max, v.Final = min(v.Min, x), max(v.Max, x), x
		v.Change = max(v.Change, relChange(x, v.Reference))
	}
	if v.Rows == 0 {
		v.Min, v.Max = 0, 0
	}
	v.Within = v.Change <= soakTolerance
	return v
}

// relChange is |x-ref|/ref; any change from zero is infinite.
func relChange(x, ref float64) float64 {
	switch {
	case x == ref:
		return 0
	case ref == 0:
		return math.Inf(1)
	}
	return math.Abs(x-ref) / ref
}

// failed names the gated figures that did not stay within.
func (sk *Soak) failed() []string {
	var out []string
	for _, v := range sk.Verdicts {
		if v.Gated && !v.Within {
			out = append(out, v.Figure)
		}
	}
	return out
}

// describeSoak is what a soak does, in a line.
func describeSoak(c *Config) string {
	where := "xdsrelay in this process (the figures are this process's: clients, relay and control plane; add --split for the relay's alone)"
	if c.Split {
		where = "xdsrelay in a child process (the figures are the relay's), its control plane in another"
	}
	s := &c.Soak
	api := "per-type services"
	if c.ADS {
		api = "ADS"
	}
	faults := fmt.Sprintf("the control plane restarted every %s (down %s)", s.RestartEvery.Round(time.Millisecond), s.Down)
	if s.Faults {
		faults = fmt.Sprintf("every %s a fault between the relay and its control plane, in turn: a control-plane restart (down %s), silence for %s (a name no one asked for before asked as it starts), a trickle at %d B/s for %s, a reset of its connections "+
			"(the relay's upstream keepalive %s, timeout %s, connect_timeout %s, cache.not_found_timeout %s)",
			s.RestartEvery.Round(time.Millisecond), s.Down, s.FaultFor, soakTrickleRate, s.FaultFor, soakKeepalive, soakKeepaliveTimeout, soakConnectTimeout, soakNotFoundTimeout)
	}
	return fmt.Sprintf("xdsload soak: %d %s clients (even ones delta, odd ones SotW, %s) through %s, in front of go-control-plane (%s cache), for %s: "+
		"a resource changed every %s, %s, %.0f%% of the clients reconnecting and as many changing subscriptions every %s, a NACK per %d responses; a row every %s, the relay's memory after a forced collection (heap: the live heap)",
		c.Clients, c.Type, api, where, c.CPCache, s.Duration, c.UpdateEvery, faults, s.Churn*100, s.ChurnEvery, s.NACKEvery, s.Every)
}

const (
	soakHeader = "%9s %10s %14s %10s %6s %8s %17s %9s\n"
	soakLine   = "%9s %10s %14s %10d %6d %8d %17s %9d\n"
)

// printHeader writes the soak's description and the rows' header to
// s.Rows, if set: the rows follow as they come.
func (sk *Soak) printHeader(c *Config) {
	w := c.Soak.Rows
	if w == nil {
		return
	}
	sk.printed = true
	fmt.Fprintf(w, "%s\n\n", describeSoak(c))
	fmt.Fprintf(w, soakHeader, "elapsed", "RSS", "heap after GC", "goroutines", "fds", "streams", "fan-out p50 (ms)", "receipts")
}

func (sk *Soak) printRow(w io.Writer, r SoakRow) {
	if w == nil {
		return
	}
	p50 := "-"
	if r.Receipts > 0 {
		p50 = ms(r.FanOutP50)
	}
	fmt.Fprintf(w, soakLine, r.Elapsed, size(r.RSS), size(r.HeapAlloc), r.Goroutines, r.FDs, r.Streams, p50, r.Receipts)
}

// writeTable prints the rows (unless they were printed as they came), the
// counts and the verdict.
func (sk *Soak) writeTable(w io.Writer, c *Config) error {
	if !sk.printed {
		fmt.Fprintf(w, "%s\n\n", describeSoak(c))
		fmt.Fprintf(w, soakHeader, "elapsed", "RSS", "heap after GC", "goroutines", "fds", "streams", "fan-out p50 (ms)", "receipts")
		for _, r := range sk.Rows {
			sk.printRow(w, r)
		}
	}
	faults := ""
	if c.Soak.Faults {
		faults = fmt.Sprintf(", %d silences, %d trickles, %d resets", sk.Silences, sk.Trickles, sk.Resets)
	}
	fmt.Fprintf(w, "\n%d changes, %d control-plane restarts%s, %d reconnects, %d resubscriptions, %d responses, %d NACKs, %d stream failures\n",
		sk.Changes, sk.Restarts, faults, sk.Reconnects, sk.Resubscribes, sk.Responses, sk.NACKs, sk.StreamFailures)
	if sk.FirstError != "" {
		fmt.Fprintf(w, "first stream failure: %s\n", sk.FirstError)
	}
	if c.Soak.Faults {
		if err := sk.writeFaults(w); err != nil {
			return err
		}
	}
	if sk.Ended {
		sk.Ending.write(w, c.Clients)
	}
	fmt.Fprintln(w)
	if len(sk.Rows) == 0 {
		_, err := fmt.Fprintln(w, "soak: no row was taken, nothing to judge")
		return err
	}
	fmt.Fprintf(w, "each figure against %s, within %.0f%%:\n\n", sk.ReferenceRule, soakTolerance*100)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "figure\tat\treference\tmin after\tmax after\tfinal\tmax change\twithin %.0f%%\tgated\t\n", soakTolerance*100)
	for _, v := range sk.Verdicts {
		sk.writeVerdict(tw, v)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	switch {
	case sk.Passed:
		fmt.Fprintf(w, "soak passed: %s within %.0f%%, every client at the control plane's last version, no spurious removal\n", strings.Join(c.Soak.Gate, ", "), soakTolerance*100)
	case c.Soak.ReportOnly:
		fmt.Fprintf(w, "soak: %s (reported only)\n", strings.Join(sk.failures(), "; "))
	default:
		fmt.Fprintf(w, "soak FAILED: %s\n", strings.Join(sk.failures(), "; "))
	}
	return nil
}

// writeFaults prints a row per fault: when, how long, when the relay
// found it, and how soon after its end the relay was back with every
// client holding every change made meanwhile.
func (sk *Soak) writeFaults(w io.Writer) error {
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "fault\tat\tlasted (s)\trelay found it after (s)\tevery client had every change, after its end (s)\t\n")
	for _, f := range sk.Faults {
		found := "-"
		if f.Detected > 0 {
			found = fmt.Sprintf("%.1f", f.Detected.Seconds())
		}
		fmt.Fprintf(tw, "%s\t%s\t%.1f\t%s\t%.2f\t\n", f.Kind, f.At.Round(time.Second), f.For.Seconds(), found, f.Back.Seconds())
	}
	return tw.Flush()
}

func (sk *Soak) writeVerdict(tw io.Writer, v SoakVerdict) {
	format := func(x float64) string {
		switch v.Figure {
		case FigureRSS, FigureHeap:
			return size(int64(x))
		case FigureFanOut:
			return ms(time.Duration(x)) + " ms"
		}
		return fmt.Sprintf("%.0f", x)
	}
	within, gated := "yes", "no"
	if !v.Within {
		within = "NO"
	}
	if v.Gated {
		gated = "yes"
	}
	if v.Rows == 0 {
		fmt.Fprintf(tw, "%s\t-\t-\t-\t-\t-\t-\t-\t%s\t\n", v.Figure, gated)
		return
	}
	fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%.1f%%\t%s\t%s\t\n", v.Figure, v.At, format(v.Reference), format(v.Min), format(v.Max),
		format(v.Final), v.Change*100, within, gated)
}
