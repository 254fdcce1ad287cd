package loadtest

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// Result is what a run measured. Latencies are from a client's start (first
// config) or from the moment an update was published (fan-out).
type Result struct {
	Config     Config        `json:"config"`
	Elapsed    time.Duration `json:"elapsed_ns"`
	Connected  int           `json:"connected"`  // streams established
	Configured int           `json:"configured"` // clients that got a first config
	Failed     int           `json:"failed"`     // clients whose stream failed
	FirstError string        `json:"first_error,omitempty"`

	// Per second, from the start to the last client established/configured.
	EstablishedPerSec float64 `json:"established_per_sec"`
	ConfiguredPerSec  float64 `json:"configured_per_sec"`

	// AllConfigured is from the start to the last client's first config;
	// zero unless every client got one.
	AllConfigured time.Duration `json:"all_configured_ns"`
	// Retries counts the streams the relay refused (Config.RelayLimits)
	// that clients tried again, RetriedClients the clients that did.
	Retries        int64 `json:"retries,omitempty"`
	RetriedClients int64 `json:"retried_clients,omitempty"`
	// Reconnects counts the streams that ended UNAVAILABLE after they
	// were answered (a connection the server closed: a drain, a fleet's
	// balance) and that clients opened again, as Envoy does.
	Reconnects int64 `json:"reconnects,omitempty"`
	// FirstConfigForeign counts first configs that carried resources this
	// run's control plane never published: with Config.RelayPersist, the
	// relay served them from the cache it restored.
	FirstConfigForeign int64 `json:"first_config_foreign,omitempty"`

	FirstConfig Summary  `json:"first_config"`     // time to first config, over clients
	FanOutLast  Summary  `json:"fan_out_last"`     // time to the last client, over updates
	FanOutAll   Summary  `json:"fan_out_receipts"` // every client's receipt of every update
	Updates     []Update `json:"updates"`

	// Connections is how many connections the clients dialed: Clients
	// divided by StreamsPerConn, rounded up; in a churn run, over the run.
	Connections   int   `json:"connections"`
	BytesReceived int64 `json:"bytes_received"`
	RSS           RSS   `json:"rss"`
	// ServerMemory is the split run's server's runtime memory once every
	// client is configured and idle, and ServerMemoryStart before the
	// clients; nil unless Config.Split.
	ServerMemory      *ServerMemory `json:"server_memory,omitempty"`
	ServerMemoryStart *ServerMemory `json:"server_memory_start,omitempty"`
	// IdlePerStream is what an idle stream costs the server.
	IdlePerStream PerStream `json:"idle_per_stream"`
	// CPU is what the server spent on the updates.
	CPU CPU `json:"cpu"`
	// ControlPlane is what the tool's control plane saw, when it serves
	// it in this process (not a split run's); nil otherwise.
	ControlPlane *ControlPlaneSeen `json:"control_plane,omitempty"`
	// Churn is what a churn run measured; nil otherwise.
	Churn *Churn `json:"churn,omitempty"`
	// Soak is what a soak measured; nil otherwise.
	Soak *Soak `json:"soak,omitempty"`

	// SeqBase is what the served resources' mark field holds before any
	// update: update seq makes it SeqBase+seq.
	SeqBase uint32 `json:"seq_base,omitempty"`
	// Early counts responses that carried an update before it was published:
	// none unless the resources come from somewhere else too.
	Early int64 `json:"early_responses,omitempty"`
}

// Update is how one update reached the clients.
type Update struct {
	Seq       int           `json:"seq"`
	Published time.Duration `json:"published_ns"` // since the run started
	Received  int           `json:"received"`     // clients that got it
	P50       time.Duration `json:"p50_ns"`
	P99       time.Duration `json:"p99_ns"`
	Last      time.Duration `json:"last_ns"` // to the last client that got it
}

// RSS is the server's resident set size, in bytes, before the clients, once
// they are all configured, and at the end; zero without a PID.
type RSS struct {
	Start      int64 `json:"start"`
	Configured int64 `json:"configured"`
	End        int64 `json:"end"`
}

// PerStream is the growth of the server from before the clients to every
// client configured and idle, divided by the clients (streams).
type PerStream struct {
	RSS        int64   `json:"rss"`        // zero without a PID
	Goroutines float64 `json:"goroutines"` // zero unless Config.Split
}

// CPU is the CPU time (user and system) the server process used while the
// updates fanned out: from just before the first update's pause to the last
// update delivered to every client, pauses included, in clock ticks of
// 10ms. With Config.Split and Config.Relay, Server is the relay's alone and
// Upstream its control plane's; otherwise the process at Config.PID (with
// --compare without --split, this process: clients included).
type CPU struct {
	Server   time.Duration `json:"server_ns"`
	Upstream time.Duration `json:"upstream_ns,omitempty"`
	Changes  int           `json:"changes"` // updates that reached every client
	// Server's per change, and per change and client.
	PerChange          time.Duration `json:"per_change_ns"`
	PerClientPerChange time.Duration `json:"per_client_per_change_ns"`
	UpstreamPerChange  time.Duration `json:"upstream_per_change_ns,omitempty"`
	// UpstreamPID is the relay's control plane's process, apart from the
	// relay's (Config.PID); 0 unless split.
	UpstreamPID int `json:"upstream_pid,omitempty"`
}

// perChange divides the CPU times by the changes and the clients.
func (c *CPU) perChange(clients int) {
	if c.Changes == 0 {
		return
	}
	c.PerChange = c.Server / time.Duration(c.Changes)
	c.PerClientPerChange = c.PerChange / time.Duration(max(clients, 1))
	c.UpstreamPerChange = c.Upstream / time.Duration(c.Changes)
}

// fillIdle computes IdlePerStream from the samples before the clients and
// once they are configured.
func (r *Result) fillIdle() {
	n := int64(max(r.Config.Clients, 1))
	if r.RSS.Start > 0 && r.RSS.Configured > 0 {
		r.IdlePerStream.RSS = (r.RSS.Configured - r.RSS.Start) / n
	}
	if r.ServerMemory != nil && r.ServerMemoryStart != nil {
		r.IdlePerStream.Goroutines = float64(r.ServerMemory.Goroutines-r.ServerMemoryStart.Goroutines) / float64(n)
	}
}

// fill computes the results from what tr recorded; the clients and the
// publisher have stopped.
func (r *Result) fill(tr *tracker, start time.Time) {
	r.Elapsed = time.Since(start)
	r.Failed = int(tr.failed.Load())
	if tr.firstErr != nil {
		r.FirstError = tr.firstErr.Error()
	}
	r.Early = tr.early.Load()
	r.Retries, r.RetriedClients, r.FirstConfigForeign = tr.retries.Load(), tr.retried.Load(), tr.foreign.Load()
	r.Reconnects = tr.reconnects.Load()
	var ttfc []time.Duration
	var lastEst, lastConf time.Time
	for i := range tr.clients {
		c := &tr.clients[i]
		if !c.established.IsZero() {
			r.Connected++
			lastEst = later(lastEst, c.established)
		}
		if !c.configured.IsZero() {
			r.Configured++
			lastConf = later(lastConf, c.configured)
			ttfc = append(ttfc, c.configured.Sub(c.started))
		}
	}
	r.EstablishedPerSec = perSecond(r.Connected, lastEst.Sub(start))
	r.ConfiguredPerSec = perSecond(r.Configured, lastConf.Sub(start))
	if r.Configured == tr.n {
		r.AllConfigured = lastConf.Sub(start)
	}
	r.FirstConfig = Summarize(ttfc)
	r.fillUpdates(tr, start)
}

func (r *Result) fillUpdates(tr *tracker, start time.Time) {
	var lasts, all []time.Duration
	for s := 1; s <= int(tr.published.Load()); s++ {
		var lat []time.Duration
		for i := range tr.clients {
			if t := tr.clients[i].recv[s]; !t.IsZero() {
				lat = append(lat, t.Sub(tr.pub[s]))
			}
		}
		sum := Summarize(lat)
		r.Updates = append(r.Updates, Update{
			Seq: s, Published: tr.pub[s].Sub(start), Received: sum.N,
			P50: sum.P50, P99: sum.P99, Last: sum.Max,
		})
		if sum.N > 0 {
			lasts = append(lasts, sum.Max)
		}
		all = append(all, lat...)
	}
	r.FanOutLast = Summarize(lasts)
	r.FanOutAll = Summarize(all)
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// perSecond is n over d, 0 for none or no time.
func perSecond[N int | int64](n N, d time.Duration) float64 {
	if n == 0 || d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds()
}

// WriteTable prints the results as tables.
func (r *Result) WriteTable(w io.Writer) error {
	if r.Soak != nil {
		return r.Soak.writeTable(w, &r.Config)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(w, "%s\n\n", r.describe())
	if r.Churn != nil {
		r.Churn.writeTable(tw, r.Connections)
	} else {
		r.writeLoadTables(tw)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	return r.writeFooter(w)
}

// writeLoadTables prints a load run's counts, latencies and updates.
func (r *Result) writeLoadTables(tw io.Writer) {
	c := &r.Config
	fmt.Fprintf(tw, "clients\tconnections\tconnected\tconfigured\tfailed\testablished/s\tconfigured/s\telapsed\t\n")
	fmt.Fprintf(tw, "%d\t%d\t%d\t%d\t%d\t%.1f\t%.1f\t%s\t\n\n", c.Clients, r.Connections, r.Connected, r.Configured, r.Failed,
		r.EstablishedPerSec, r.ConfiguredPerSec, r.Elapsed.Round(time.Millisecond))
	fmt.Fprintf(tw, "latency (ms)\tn\tmin\tp50\tp90\tp99\tmax\t\n")
	summaryRow(tw, "time to first config", r.FirstConfig)
	if c.Updates > 0 {
		summaryRow(tw, "fan-out, last client", r.FanOutLast)
		summaryRow(tw, "fan-out, every receipt", r.FanOutAll)
	}
	fmt.Fprintln(tw)
	if c.Updates > 0 {
		fmt.Fprintf(tw, "update\tpublished (s)\treceived\tp50 (ms)\tp99 (ms)\tlast (ms)\t\n")
		for _, u := range r.Updates {
			fmt.Fprintf(tw, "%d\t%.3f\t%d/%d\t%s\t%s\t%s\t\n", u.Seq, u.Published.Seconds(), u.Received, c.Clients, ms(u.P50), ms(u.P99), ms(u.Last))
		}
		fmt.Fprintln(tw)
	}
}

func (r *Result) describe() string {
	c := &r.Config
	api := "per-type"
	if c.ADS {
		api = "ADS"
	}
	s := fmt.Sprintf("xdsload: %d %s %s %s clients → %s, node cluster %q", c.Clients, c.Variant, api, c.Type, c.Target, c.NodeCluster)
	switch {
	case c.Floor:
		s = fmt.Sprintf("xdsload floor: %d TCP connections, frames sized as %s %s responses", c.Clients, c.Variant, c.Type)
	case c.GRPCFloor:
		s = fmt.Sprintf("xdsload gRPC floor: %d %s %s %s clients → %s, a bare grpc-go server writing pre-encoded responses", c.Clients, c.Variant, api, c.Type, c.Target)
	}
	if c.updating() {
		s += fmt.Sprintf("; %d resources", c.Resources)
		if c.Type == "eds" {
			s += fmt.Sprintf(" × %d endpoints", c.Endpoints)
		}
		s += fmt.Sprintf(", %d updates every %s", c.Updates, c.UpdateEvery)
	}
	if c.ServeCP != "" && !c.Floor {
		s += fmt.Sprintf(", %s cache", c.CPCache)
	}
	switch {
	case c.Relay && c.Split:
		s += ", through xdsrelay"
	case c.Relay:
		s += ", through xdsrelay in this process"
	}
	if c.Relay && len(c.RelayGroupBy) > 0 {
		s += ", group_by [" + strings.Join(c.RelayGroupBy, ", ") + "]"
	}
	if c.Split && c.Relay {
		s += "; relay and control plane each in a child process"
	} else if c.Split {
		s += "; server side in a child process"
	}
	if c.StreamsPerConn > 1 {
		s += fmt.Sprintf(", %d streams per connection", c.StreamsPerConn)
	}
	if c.Churn > 0 {
		s += fmt.Sprintf("; churn for %s", c.Churn)
	}
	if len(c.Names) > 0 {
		s += ", names " + strings.Join(c.Names, ",")
	}
	return s
}

func (r *Result) writeFooter(w io.Writer) error {
	n := int64(max(r.Config.Clients, 1))
	fmt.Fprintf(w, "bytes received: %s (%s per client)\n", size(r.BytesReceived), size(r.BytesReceived/n))
	if cp := r.ControlPlane; cp != nil {
		fmt.Fprintf(w, "control plane: %d xDS streams on %d connections once every client was configured; %d responses for %d updates (%.1f per update)\n",
			cp.Streams, cp.Connections, cp.Responses, r.Config.Updates, cp.PerUpdate)
	}
	if r.Config.PID > 0 {
		fmt.Fprintf(w, "server RSS (pid %d): start %s, configured %s (%s per client), end %s (%s per client since configured)\n",
			r.Config.PID, size(r.RSS.Start), size(r.RSS.Configured), size((r.RSS.Configured-r.RSS.Start)/n),
			size(r.RSS.End), size((r.RSS.End-r.RSS.Configured)/n))
	}
	if r.Config.Updates > 0 && r.CPU.Changes > 0 {
		fmt.Fprintf(w, "server CPU over %d changes: %s, %s per change, %s per client per change%s\n",
			r.CPU.Changes, r.CPU.Server, r.CPU.PerChange, r.CPU.PerClientPerChange, r.upstreamCPU())
	}
	if m := r.ServerMemory; m != nil {
		fmt.Fprintf(w, "server goroutines per idle stream: %.2f (%d before the clients, %d once configured)\n",
			r.IdlePerStream.Goroutines, r.ServerMemoryStart.goroutines(), m.Goroutines)
		fmt.Fprintf(w, "server memory once configured: %d goroutines (%.1f per client), stacks %s (%s per client), heap in use %s (%s per client), runtime total %s\n",
			m.Goroutines, float64(m.Goroutines)/float64(n), size(int64(m.StackInuse)), size(int64(m.StackInuse)/n),
			size(int64(m.HeapInuse)), size(int64(m.HeapInuse)/n), size(int64(m.Sys)))
	}
	if line := r.admission(); line != "" {
		fmt.Fprintln(w, line)
	}
	if r.SeqBase > 0 {
		fmt.Fprintf(w, "update seq is marked in the resources as %d+seq (%s)\n", r.SeqBase, markField[r.Config.Type])
	}
	if r.Early > 0 {
		fmt.Fprintf(w, "warning: %d responses carried an update before it was published: does another control plane feed the target?\n", r.Early)
	}
	if r.Reconnects > 0 {
		fmt.Fprintf(w, "%d streams the server closed after they were answered were opened again (a drain, a fleet's balance)\n", r.Reconnects)
	}
	if r.FirstError != "" {
		fmt.Fprintf(w, "first client error: %s\n", r.FirstError)
	}
	return nil
}

// admission describes, with the relay's limits or its saved cache, how the
// clients got in: empty otherwise.
func (r *Result) admission() string {
	c := &r.Config
	if !c.RelayLimits && c.RelayPersist == "" {
		return ""
	}
	all := "not every client configured"
	if r.AllConfigured > 0 {
		all = fmt.Sprintf("every client configured after %s", r.AllConfigured.Round(time.Millisecond))
	}
	s := "relay admission: " + all
	if c.RelayLimits {
		s += fmt.Sprintf("; limits on: %d streams refused and retried, by %d clients (backoff %s to %s, x%g, jitter %g)", r.Retries, r.RetriedClients,
			envoyBackoff.BaseDelay, envoyBackoff.MaxDelay, envoyBackoff.Multiplier, envoyBackoff.Jitter)
	}
	if c.RelayPersist != "" {
		s += fmt.Sprintf("; first configs from the relay's saved cache (%s), resources this run did not publish: %d/%d", c.RelayPersist, r.FirstConfigForeign, c.Clients)
	}
	return s
}

// upstreamCPU describes the relay's control plane's CPU, if measured.
func (r *Result) upstreamCPU() string {
	if r.CPU.Upstream == 0 {
		return ""
	}
	return fmt.Sprintf("; the relay's control plane (another process): %s, %s per change", r.CPU.Upstream, r.CPU.UpstreamPerChange)
}

var markField = map[string]string{
	"eds": "the first endpoint's port",
	"cds": "per_connection_buffer_limit_bytes",
	"lds": "per_connection_buffer_limit_bytes",
	"rds": "max_direct_response_body_size_bytes",
}

func summaryRow(w io.Writer, name string, s Summary) {
	fmt.Fprintf(w, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t\n", name, s.N, ms(s.Min), ms(s.P50), ms(s.P90), ms(s.P99), ms(s.Max))
}

func ms(d time.Duration) string { return fmt.Sprintf("%.3f", float64(d)/float64(time.Millisecond)) }

// size formats a byte count with a binary unit; negative counts keep their sign.
func size(b int64) string {
	const unit = 1024
	v, units := float64(b), []string{"B", "KiB", "MiB", "GiB", "TiB"}
	i := 0
	for ; i < len(units)-1 && (v >= unit || v <= -unit); i++ {
		v /= unit
	}
	if i == 0 {
		return fmt.Sprintf("%d B", b)
	}
	return fmt.Sprintf("%.1f %s", v, units[i])
}
