package loadtest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/xdsrelay/xdsrelay/fleet"
)

// FleetConfig describes a fleet run (RunFleet).
type FleetConfig struct {
	// Relays is how many xdsrelay processes run; 0: no fleet run.
	Relays int `json:"relays,omitempty"`
	// Groups is how many groups (node.cluster g0 to gN-1) the clients are
	// spread over; 30 if 0.
	Groups int `json:"groups,omitempty"`
	// RelayBin is the xdsrelay executable that runs each relay.
	RelayBin string `json:"relay_bin,omitempty"`
	// BalanceFor is how long each relay's clients are sampled after the
	// one killed starts again; 2m if 0.
	BalanceFor time.Duration `json:"balance_for_ns,omitempty"`
}

// The fleet's balance bound, as the relays run it (fleet.balance_slack's
// default).
const fleetSlack = 0.2

// ValidateFleet reports the first problem with a defaulted cfg for a
// fleet run.
func (cfg *Config) ValidateFleet() error {
	f := &cfg.Fleet
	switch {
	case f.RelayBin == "":
		return errors.New("fleet: give --relay-bin, the xdsrelay executable (go build -o xdsrelay ./cmd/xdsrelay)")
	case f.Relays < 2:
		return fmt.Errorf("fleet: %d relays: a fleet has 2 or more", f.Relays)
	case f.Groups < 1 || cfg.Clients < f.Relays*f.Groups:
		return fmt.Errorf("fleet: %d clients over %d groups and %d relays: give at least a client of each group on each relay", cfg.Clients, f.Groups, f.Relays)
	case cfg.Updates < 1:
		return errors.New("fleet: give 1 or more --updates")
	case cfg.Variant != VariantDelta || !cfg.ADS || cfg.Split || cfg.Relay || cfg.Target != "":
		return errors.New("fleet: the clients speak delta ADS to the relays it starts, in front of its own control plane (give no --variant sotw, --ads=false, --split, --relay or --target)")
	}
	return nil
}

// Fleet is what a fleet run measured.
type Fleet struct {
	Config Config `json:"config"`
	// Without is the load on relays that do not know each other; With,
	// the same load on a fleet.
	Without *FleetRun         `json:"apart"`
	With    *FleetRun         `json:"fleet"`
	Hop     FleetHop          `json:"hop"`
	Kill    FleetKill         `json:"kill"`
	Balance []FleetBalanceRow `json:"balance"`
	// Within is how long after the killed relay started again every
	// relay was within the slack, and stayed so; -1 if never.
	Within time.Duration `json:"within_ns"`
	// MostMoves is the most streams of one client that ended while the
	// fleet balanced (its moves).
	MostMoves int `json:"most_moves"`

	Passed   bool     `json:"passed"`
	Failures []string `json:"failures,omitempty"`
	// Goals are the figures the fleet aims at, met or not (a shared
	// machine's CPU and latency vary: they do not fail the run).
	Goals []string `json:"goals,omitempty"`
	Dir   string   `json:"dir,omitempty"` // the relays' logs, kept when the run failed
}

// FleetRun is one run's control plane and clients.
type FleetRun struct {
	// Streams is the control plane's streams open once settled.
	Streams int `json:"cp_streams"`
	// CPUPerChange is the control plane's CPU over the updates, per update.
	CPUPerChange time.Duration `json:"cp_cpu_per_change_ns"`
	// Latency is from each update's publish to each client's receipt.
	Latency Summary `json:"change_to_client"`

	pub []time.Time // by seq, when the control plane published it
}

// measure reads the control plane's streams, then publishes the updates,
// each once every client has the one before, and reads its CPU across.
func (run *FleetRun) measure(ctx context.Context, cfg *Config, s *fleetSetup, fc *fleetClients) error {
	by, _, err := s.streams()
	if err != nil {
		return err
	}
	for _, n := range by {
		run.Streams += n
	}
	run.pub = make([]time.Time, cfg.Updates+2)
	cpu := sampleCPU(s.cp.pid)
	for seq := 1; seq <= cfg.Updates; seq++ {
		if err := pause(ctx, cfg.UpdateEvery); err != nil {
			return err
		}
		if run.pub[seq], err = s.cp.publish(seq); err != nil {
			return err
		}
		if err := fc.waitHave(ctx, seq, fleetDelivery); err != nil {
			return err
		}
	}
	run.CPUPerChange = (sampleCPU(s.cp.pid) - cpu) / time.Duration(cfg.Updates)
	var lat []time.Duration
	for _, c := range fc.clients {
		lat = append(lat, fc.latencies(c, run.pub, cfg.Updates)...)
	}
	run.Latency = Summarize(lat)
	return nil
}

// latencies are c's times from publish to receipt of those of updates 1
// to n that change its group.
func (fc *fleetClients) latencies(c *fleetClient, pub []time.Time, n int) []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []time.Duration
	for seq := 1; seq <= n; seq++ {
		if fc.changes(c, seq) && !c.got[seq].IsZero() && !pub[seq].IsZero() {
			out = append(out, c.got[seq].Sub(pub[seq]))
		}
	}
	return out
}

// FleetHop is the change-to-client latency of the clients of a group's
// owner, and of those whose relay draws the group from the owner.
type FleetHop struct {
	Owner Summary `json:"owner"`
	Peer  Summary `json:"peer"`
}

// measure splits the fleet run's latencies by where each client's relay
// draws its group from, as its /debug/fleet says.
func (h *FleetHop) measure(s *fleetSetup, fc *fleetClients, pub []time.Time) error {
	sources := make([]map[string]string, len(s.relays))
	for k, p := range s.relays {
		df, err := debugFleet(p.admin)
		if err != nil {
			return fmt.Errorf("relay %s: /debug/fleet: %w", p.name, err)
		}
		sources[k] = map[string]string{}
		for _, g := range df.Groups {
			sources[k][g.Key] = g.Source
		}
	}
	var owner, peer []time.Duration
	for _, c := range fc.clients {
		c.mu.Lock()
		k := c.relay
		c.mu.Unlock()
		if k < 0 {
			continue
		}
		lat := fc.latencies(c, pub, len(pub)-2)
		if sources[k]["cluster="+c.group] == "control_plane" {
			owner = append(owner, lat...)
		} else {
			peer = append(peer, lat...)
		}
	}
	h.Owner, h.Peer = Summarize(owner), Summarize(peer)
	return nil
}

// FleetKill is what killing one relay cost.
type FleetKill struct {
	Relay string `json:"relay"`
	// Moved is the groups the relay owned; NewStreams the streams the
	// control plane opened until it held one per group again.
	Moved      int `json:"groups_moved"`
	NewStreams int `json:"new_cp_streams"`
	// Removals and Resent are what the clients were told from the kill
	// to an update every one holds: removals, and resources sent again at
	// the version held on a stream that had answered.
	Removals int `json:"removals"`
	Resent   int `json:"resent_unchanged"`
	// Refetched is, per moved group, the time from the kill until the
	// control plane held a stream of it again.
	Refetched Summary `json:"refetched"`
}

// measure kills relay 0 with SIGKILL and follows its groups' move.
func (kl *FleetKill) measure(ctx context.Context, cfg *Config, s *fleetSetup, fc *fleetClients) error {
	p := s.relays[0]
	kl.Relay = p.name
	df, err := debugFleet(p.admin)
	if err != nil {
		return err
	}
	var moved []string
	for _, g := range df.Groups {
		if g.Owner == df.Self {
			moved = append(moved, strings.TrimPrefix(g.Key, "cluster="))
		}
	}
	kl.Moved = len(moved)
	_, opened, err := s.streams()
	if err != nil {
		return err
	}
	fc.reset()
	killed := time.Now()
	_ = p.cmd.Process.Kill()
	<-p.exited
	times, err := refetched(ctx, s, moved, killed)
	if err != nil {
		return err
	}
	kl.Refetched = Summarize(times)
	if err := s.settle(ctx, cfg.Fleet.Groups, 1); err != nil {
		return err
	}
	_, after, err := s.streams()
	if err != nil {
		return err
	}
	kl.NewStreams = after - opened
	seq := cfg.Updates + 1
	if _, err := s.cp.publish(seq); err != nil {
		return err
	}
	if err := fc.waitHave(ctx, seq, fleetRefetch); err != nil {
		return fmt.Errorf("the update after the kill: %w", err)
	}
	kl.Removals, kl.Resent, _ = fc.counts(func(*fleetClient) bool { return true })
	return nil
}

// refetched waits until the control plane, having lost the killed relay's
// stream of each of groups, holds one again, and returns the time from
// killed to that for each.
func refetched(ctx context.Context, s *fleetSetup, groups []string, killed time.Time) ([]time.Duration, error) {
	lost := map[string]bool{}
	back := map[string]time.Duration{}
	err := waitFor(ctx, fleetRefetch, func() bool {
		by, _, err := s.streams()
		if err != nil {
			return false
		}
		for _, g := range groups {
			switch {
			case by[g] == 0:
				lost[g] = true
			case lost[g] && back[g] == 0:
				back[g] = time.Since(killed)
			}
		}
		return len(back) == len(groups)
	}, func() string { return fmt.Sprintf("%d of %d moved groups fetched again", len(back), len(groups)) })
	var out []time.Duration
	for _, d := range back {
		out = append(out, d)
	}
	return out, err
}

// FleetBalanceRow is each relay's clients (xdsrelay_fleet_clients) at a
// moment after the killed relay started again.
type FleetBalanceRow struct {
	At      time.Duration `json:"at_ns"`
	Clients []int         `json:"clients"`
}

// balance starts the killed relay again and samples each relay's clients
// every second for BalanceFor.
func (fl *Fleet) balance(ctx context.Context, cfg *Config, s *fleetSetup, fc *fleetClients) error {
	p := s.relays[0]
	if err := p.start(); err != nil {
		return err
	}
	if err := s.ready(ctx, true); err != nil {
		return err
	}
	fc.reset()
	start := time.Now()
	fl.Within = -1
	bound := fleet.Bound(cfg.Clients, len(s.relays), fleetSlack)
	for at := time.Duration(0); at <= cfg.Fleet.BalanceFor; at += time.Second {
		if err := pause(ctx, time.Until(start.Add(at))); err != nil {
			return err
		}
		row := FleetBalanceRow{At: at}
		within := true
		for _, r := range s.relays {
			n, err := scrapeGauge(r.admin, "xdsrelay_fleet_clients")
			if err != nil {
				return err
			}
			row.Clients = append(row.Clients, n)
			within = within && n <= bound
		}
		fl.Balance = append(fl.Balance, row)
		switch {
		case !within:
			fl.Within = -1
		case fl.Within < 0:
			fl.Within = at
		}
	}
	_, _, fl.MostMoves = fc.counts(func(*fleetClient) bool { return true })
	return nil
}

// judge fills Passed, Failures and Goals.
func (fl *Fleet) judge(err error) {
	if err != nil {
		fl.Failures = append(fl.Failures, err.Error())
	}
	cfg := &fl.Config
	g := cfg.Fleet.Groups
	if w := fl.With; w != nil {
		if w.Streams != g {
			fl.Failures = append(fl.Failures, fmt.Sprintf("the control plane held %d streams with the fleet, want one per group (%d)", w.Streams, g))
		}
		if k := fl.Kill; k.Relay != "" {
			if k.Removals != 0 || k.Resent != 0 {
				fl.Failures = append(fl.Failures, fmt.Sprintf("a relay killed: the clients were told of %d removals and sent %d resources again unchanged, want 0", k.Removals, k.Resent))
			}
			if k.NewStreams > k.Moved {
				fl.Failures = append(fl.Failures, fmt.Sprintf("a relay killed: %d new streams at the control plane, want at most the %d groups moved", k.NewStreams, k.Moved))
			}
		}
		if len(fl.Balance) > 0 && fl.Within < 0 {
			fl.Failures = append(fl.Failures, "balance: the relays were not all within the slack at the end")
		}
		if len(fl.Balance) > 0 && fl.MostMoves > 2 {
			fl.Failures = append(fl.Failures, fmt.Sprintf("balance: a client moved %d times, want 2 at most", fl.MostMoves))
		}
	}
	if fl.Without != nil && fl.With != nil && fl.Without.CPUPerChange > 0 {
		ratio := float64(fl.With.CPUPerChange) / float64(fl.Without.CPUPerChange)
		fl.Goals = append(fl.Goals, fmt.Sprintf("control plane CPU per change %.2fx without the fleet (goal 0.4x at most): %s", ratio, met(ratio <= 0.4)))
	}
	if fl.Hop.Owner.N > 0 && fl.Hop.Peer.N > 0 {
		extra := fl.Hop.Peer.P50 - fl.Hop.Owner.P50
		fl.Goals = append(fl.Goals, fmt.Sprintf("the extra hop: p50 %+.1fms over the owner's clients (goal +5ms at most): %s", float64(extra)/float64(time.Millisecond), met(extra <= 5*time.Millisecond)))
	}
	fl.Passed = len(fl.Failures) == 0
}

func met(ok bool) string {
	if ok {
		return "met"
	}
	return "missed"
}

// WriteTable writes the run as tables.
func (fl *Fleet) WriteTable(w io.Writer) error {
	c := &fl.Config
	fmt.Fprintf(w, "fleet: %d relays (%s), %d groups, %d clients (delta ADS, %s, %d resources), %d updates every %s, the control plane's %s cache\n\n",
		c.Fleet.Relays, c.Fleet.RelayBin, c.Fleet.Groups, c.Clients, c.Type, c.Resources, c.Updates, c.UpdateEvery, c.CPCache)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "\tapart\tfleet")
	row := func(name string, f func(*FleetRun) string) {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", name, orNone(fl.Without, f), orNone(fl.With, f))
	}
	row("control plane streams", func(r *FleetRun) string { return fmt.Sprint(r.Streams) })
	row("control plane CPU per change (ms)", func(r *FleetRun) string { return ms(r.CPUPerChange) })
	row("change to client p50 (ms)", func(r *FleetRun) string { return ms(r.Latency.P50) })
	row("change to client p99 (ms)", func(r *FleetRun) string { return ms(r.Latency.P99) })
	if err := tw.Flush(); err != nil {
		return err
	}
	h, k := fl.Hop, fl.Kill
	fmt.Fprintf(w, "\nthe extra hop: the owner's clients p50 %sms p99 %sms (%d), the others' p50 %sms p99 %sms (%d)\n",
		ms(h.Owner.P50), ms(h.Owner.P99), h.Owner.N, ms(h.Peer.P50), ms(h.Peer.P99), h.Peer.N)
	if k.Relay != "" {
		fmt.Fprintf(w, "relay %s killed: %d groups moved, %d new streams at the control plane, %d removals, %d resources sent again unchanged; each moved group fetched again after p50 %s, max %s\n",
			k.Relay, k.Moved, k.NewStreams, k.Removals, k.Resent, k.Refetched.P50.Round(time.Millisecond), k.Refetched.Max.Round(time.Millisecond))
	}
	if err := fl.writeBalance(w); err != nil {
		return err
	}
	for _, g := range fl.Goals {
		fmt.Fprintln(w, "goal:", g)
	}
	if fl.Passed {
		_, err := fmt.Fprintln(w, "fleet run passed")
		return err
	}
	_, err := fmt.Fprintf(w, "fleet run FAILED: %s\n", strings.Join(fl.Failures, "; "))
	return err
}

// writeBalance writes each relay's clients every 5s, and the last row.
func (fl *Fleet) writeBalance(w io.Writer) error {
	if len(fl.Balance) == 0 {
		return nil
	}
	fmt.Fprintf(w, "\nbalance after %s started again (xdsrelay_fleet_clients; slack %v):\n", fl.Kill.Relay, fleetSlack)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "t\t")
	for k := range fl.Balance[0].Clients {
		fmt.Fprintf(tw, "r%d\t", k)
	}
	fmt.Fprintln(tw)
	for i, r := range fl.Balance {
		if i%5 != 0 && i != len(fl.Balance)-1 {
			continue
		}
		fmt.Fprintf(tw, "%s\t", r.At)
		for _, n := range r.Clients {
			fmt.Fprintf(tw, "%d\t", n)
		}
		fmt.Fprintln(tw)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	within := "never"
	if fl.Within >= 0 {
		within = "after " + fl.Within.String()
	}
	_, err := fmt.Fprintf(w, "every relay within the slack %s; the most moves of one client %d\n", within, fl.MostMoves)
	return err
}

func orNone(r *FleetRun, f func(*FleetRun) string) string {
	if r == nil {
		return "-"
	}
	return f(r)
}
