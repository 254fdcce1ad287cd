package loadtest

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// smallSoak is a tiny soak through the relay.
func smallSoak(mod func(*Config)) Config {
	cfg := smallLoad(func(c *Config) {
		c.Relay, c.CPCache, c.Clients, c.Resources, c.Endpoints = true, CacheLinear, 50, 4, 5
		c.UpdateEvery, c.Timeout = 500*time.Millisecond, time.Minute
		c.Soak = SoakConfig{Duration: 6 * time.Second, Every: time.Second, RestartEvery: 2 * time.Second,
			Down: 200 * time.Millisecond, ChurnEvery: time.Second, NACKEvery: 10, ReportOnly: true}
	})
	mod(&cfg)
	return cfg
}

// A tiny soak in this process: a row a second with every figure, the
// schedule carried out, and each figure held to its value after the
// first half.
func TestSoak(t *testing.T) {
	var progress, rows strings.Builder
	res, err := Run(t.Context(), smallSoak(func(c *Config) { c.Progress, c.Soak.Rows = &progress, &rows }))
	if err != nil {
		t.Fatalf("%v\n%s", err, progress.String())
	}
	sk := res.Soak
	if len(sk.Rows) != 6 {
		t.Fatalf("%d rows, want 6:\n%s", len(sk.Rows), rows.String())
	}
	for i, r := range sk.Rows {
		if r.Elapsed != time.Duration(i+1)*time.Second || r.RSS <= 0 || r.HeapAlloc <= 0 || r.Goroutines <= 0 || r.FDs <= 0 ||
			r.Streams < 40 || r.Streams > 50 {
			t.Errorf("row %d: %+v", i, r)
		}
	}
	receipts := 0
	for _, r := range sk.Rows {
		receipts += r.Receipts
	}
	if receipts == 0 || sk.Changes < 4 || sk.Restarts < 1 || sk.Reconnects < 1 || sk.Resubscribes < 1 || sk.NACKs < 1 || sk.StreamFailures != 0 {
		t.Errorf("receipts %d, soak %+v; want changes, restarts, reconnects, resubscriptions and NACKs, no failures", receipts, sk)
	}
	checkVerdicts(t, sk, 3*time.Second)
	for _, want := range []string{"heap after GC", "fan-out p50"} {
		if !strings.Contains(rows.String(), want) {
			t.Errorf("rows lack %q:\n%s", want, rows.String())
		}
	}
	var table strings.Builder
	if err := res.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"after the first half (3s", "within 10%", "goroutines", "NACKs"} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, table.String())
		}
	}
}

// checkVerdicts checks that every figure was judged against the row at ref,
// and that the soak passed if and only if every gated one stayed within.
func checkVerdicts(t *testing.T, sk *Soak, ref time.Duration) {
	t.Helper()
	if len(sk.Verdicts) != len(SoakFigures) || sk.Reference != ref || !strings.Contains(sk.ReferenceRule, "first half") {
		t.Fatalf("verdicts %+v against %s (%s), want every figure against %s", sk.Verdicts, sk.Reference, sk.ReferenceRule, ref)
	}
	passed := true
	for _, v := range sk.Verdicts {
		if v.Figure != FigureFanOut && (v.At != ref || v.Rows == 0 || v.Reference <= 0) {
			t.Errorf("verdict %+v: want the row at %s against the later ones", v, ref)
		}
		passed = passed && (v.Within || !v.Gated)
	}
	if sk.Passed != passed {
		t.Errorf("passed %v, but the gated verdicts say %v: %+v", sk.Passed, passed, sk.Verdicts)
	}
}

// With --split the rows are the relay's child's.
func TestSoakSplit(t *testing.T) {
	var progress strings.Builder
	res, err := Run(t.Context(), smallSoak(func(c *Config) {
		c.Split, c.Clients, c.Progress = true, 20, &progress
		c.Soak.Duration = 4 * time.Second
	}))
	if err != nil {
		t.Fatalf("%v\n%s", err, progress.String())
	}
	sk := res.Soak
	if len(sk.Rows) != 4 || sk.Restarts < 1 || sk.StreamFailures != 0 {
		t.Fatalf("soak %+v", sk)
	}
	self := readMemory().Goroutines
	for i, r := range sk.Rows {
		// The relay's child holds a few goroutines per stream; this
		// process the clients', the control plane's child the rest.
		if r.Goroutines <= 0 || r.Goroutines == self || r.FDs <= 20 || r.Streams < 15 || r.Streams > 20 {
			t.Errorf("row %d: %+v (this process has %d goroutines)", i, r, self)
		}
	}
	checkVerdicts(t, sk, 2*time.Second)
}

func TestSoakJudge(t *testing.T) {
	row := func(s int, goroutines int, p50 time.Duration, receipts int) SoakRow {
		return SoakRow{Elapsed: time.Duration(s) * time.Second,
			RelaySample: RelaySample{RSS: 100 << 20, HeapAlloc: 10 << 20, Goroutines: goroutines, FDs: 50, Streams: 20},
			FanOutP50:   p50, Receipts: receipts}
	}
	ms := time.Millisecond
	tests := []struct {
		name     string
		d        time.Duration
		gate     []string
		rows     []SoakRow
		passed   bool
		failed   []string
		at       time.Duration // of the goroutines' reference row
		fanOutAt time.Duration
	}{
		{"steady", 4 * time.Second, SoakFigures,
			[]SoakRow{row(1, 90, 5*ms, 9), row(2, 100, 5*ms, 9), row(3, 105, 5*ms, 9), row(4, 95, 5*ms, 9)},
			true, nil, 2 * time.Second, 2 * time.Second},
		{"a goroutine leak", 4 * time.Second, SoakFigures,
			[]SoakRow{row(1, 100, 5*ms, 9), row(2, 100, 5*ms, 9), row(3, 105, 5*ms, 9), row(4, 120, 5*ms, 9)},
			false, []string{FigureGoroutines}, 2 * time.Second, 2 * time.Second},
		{"growth before the reference does not count", 4 * time.Second, SoakFigures,
			[]SoakRow{row(1, 50, 5*ms, 9), row(2, 100, 5*ms, 9), row(3, 100, 5*ms, 9), row(4, 100, 5*ms, 9)},
			true, nil, 2 * time.Second, 2 * time.Second},
		{"slower fan-out, not gated", 4 * time.Second, []string{FigureGoroutines, FigureFDs, FigureHeap},
			[]SoakRow{row(1, 100, 5*ms, 9), row(2, 100, 5*ms, 9), row(3, 100, 9*ms, 9), row(4, 100, 5*ms, 9)},
			true, nil, 2 * time.Second, 2 * time.Second},
		{"slower fan-out, gated", 4 * time.Second, SoakFigures,
			[]SoakRow{row(1, 100, 5*ms, 9), row(2, 100, 5*ms, 9), row(3, 100, 9*ms, 9), row(4, 100, 5*ms, 9)},
			false, []string{FigureFanOut}, 2 * time.Second, 2 * time.Second},
		{"no receipt at the reference: the next row with some", 4 * time.Second, SoakFigures,
			[]SoakRow{row(1, 100, 0, 0), row(2, 100, 0, 0), row(3, 100, 5*ms, 9), row(4, 100, 5*ms, 9)},
			true, nil, 2 * time.Second, 3 * time.Second},
		{"a long soak: after the first 5m", time.Hour, SoakFigures,
			[]SoakRow{row(240, 50, 5*ms, 9), row(300, 100, 5*ms, 9), row(360, 100, 5*ms, 9)},
			true, nil, 5 * time.Minute, 5 * time.Minute},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sk := &Soak{Rows: tt.rows}
			sk.judge(&SoakConfig{Duration: tt.d, Gate: tt.gate})
			if sk.Passed != tt.passed || strings.Join(sk.failed(), ",") != strings.Join(tt.failed, ",") {
				t.Errorf("passed %v, failed %v; want %v, %v: %+v", sk.Passed, sk.failed(), tt.passed, tt.failed, sk.Verdicts)
			}
			for _, v := range sk.Verdicts {
				want := tt.at
				if v.Figure == FigureFanOut {
					want = tt.fanOutAt
				}
				if v.At != want {
					t.Errorf("%s held to the row at %s, want %s", v.Figure, v.At, want)
				}
			}
		})
	}
}

// Update marks wrap over soakMarks; a client maps one back to the latest
// update announced that carries it.
func TestSoakUnwrap(t *testing.T) {
	coding := seqCoding{updates: soakMarks, wrap: true}
	mark := func(seq int) int { return (seq-1)%coding.updates + 1 }
	tests := []struct {
		announced, seq int
	}{
		{1, 1}, {5, 3}, {soakMarks, soakMarks}, {soakMarks + 1, soakMarks + 1}, {soakMarks + 1, soakMarks},
		{10*soakMarks + 7, 10*soakMarks + 7}, {10*soakMarks + 7, 10*soakMarks - 990},
	}
	for _, tt := range tests {
		st := newSoakTracker(1, []string{"a", "b"}, 1)
		st.announce(tt.announced)
		if got := st.unwrap(mark(tt.seq)); got != tt.seq {
			t.Errorf("announced %d, mark %d: update %d, want %d", tt.announced, mark(tt.seq), got, tt.seq)
		}
	}
	st := newSoakTracker(1, []string{"a", "b"}, 1)
	if got := st.unwrap(mark(1)); got != -1 {
		t.Errorf("nothing announced: update %d, want -1", got)
	}
	st.announce(3)
	if got := st.unwrap(0); got != -1 {
		t.Errorf("mark 0, the initial resources: update %d, want -1", got)
	}
}

func TestSumGauge(t *testing.T) {
	body := `# HELP xdsrelay_downstream_streams Open downstream xDS streams.
# TYPE xdsrelay_downstream_streams gauge
xdsrelay_downstream_streams{variant="delta-ads"} 25
xdsrelay_downstream_streams{variant="sotw-ads"} 24
xdsrelay_downstream_streams_total 99
xdsrelay_upstream_connected{group="cluster=load"} 1
`
	if n, err := sumGauge(strings.NewReader(body), streamsMetric); n != 49 || err != nil {
		t.Errorf("streams %d, %v; want 49", n, err)
	}
	if n, err := sumGauge(strings.NewReader(body), connectedMetric); n != 1 || err != nil {
		t.Errorf("connected %d, %v; want 1", n, err)
	}
	if _, err := sumGauge(strings.NewReader("other 1\n"), streamsMetric); err == nil {
		t.Error("no streams gauge: no error")
	}
}

func TestSoakValidate(t *testing.T) {
	tests := []struct {
		name string
		mod  func(*Config)
		want string
	}{
		{"without the relay", func(c *Config) { c.Relay = false }, "relay"},
		{"with churn", func(c *Config) { c.Churn = time.Second }, "churn"},
		{"rows longer than the soak", func(c *Config) { c.Soak.Every = time.Minute }, "soak-every"},
		{"down past the restarts", func(c *Config) { c.Soak.Down = 5 * time.Second }, "soak-restart-every"},
		{"more than every client", func(c *Config) { c.Soak.Churn = 2 }, "soak-churn"},
		{"an unknown figure", func(c *Config) { c.Soak.Gate = []string{"cpu"} }, "soak-gate"},
		{"one name", func(c *Config) { c.Names = []string{"cla-1"} }, "two resources"},
		{"timeout within the soak", func(c *Config) { c.Timeout = 5 * time.Second }, "timeout"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := smallSoak(tt.mod).Defaults()
			if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("%v, want an error naming %s", err, tt.want)
			}
		})
	}
	cfg := Config{ServeCP: "127.0.0.1:0", Relay: true, Soak: SoakConfig{Duration: 20 * time.Second}}.Defaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	s := cfg.Soak
	if s.Every != 5*time.Second || s.RestartEvery != 20*time.Second/3 || s.Down != time.Second || s.ChurnEvery != 5*time.Second ||
		s.Churn != 0.05 || s.NACKEvery != 100 || !slices.Equal(s.Gate, soakGateDefault) || cfg.UpdateEvery != 2*time.Second || cfg.Timeout != 20*time.Second+soakGrace {
		t.Errorf("a 20s soak's defaults: %+v, every change %s, timeout %s", s, cfg.UpdateEvery, cfg.Timeout)
	}
}
