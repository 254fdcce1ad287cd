package loadtest

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// RollingConfig describes a rolling restart (Config.Rolling, RunRolling).
type RollingConfig struct {
	// RelayBin is the xdsrelay executable that runs each relay.
	RelayBin string `json:"relay_bin,omitempty"`
}

// ValidateRolling reports the first problem with a defaulted cfg for a
// rolling restart.
func (cfg *Config) ValidateRolling() error {
	switch {
	case cfg.Rolling.RelayBin == "":
		return errors.New("rolling needs relay-bin: the xdsrelay executable (go build -o xdsrelay ./cmd/xdsrelay)")
	case cfg.ServeCP == "" || cfg.Target != "" || cfg.Relay || cfg.Split || cfg.Floor || cfg.GRPCFloor || cfg.Churn > 0 || cfg.soaking() || cfg.LRS:
		return errors.New("rolling runs two xdsrelay processes in front of the tool's control plane: give serve-cp, and neither target, relay, split, floor, grpc-floor, churn, soak nor lrs")
	case cfg.UpdateEvery <= 0:
		return errors.New("update-every: a rolling restart needs a positive interval between changes")
	case cfg.StreamsPerConn > relayStreamsPerConn:
		return fmt.Errorf("streams-per-conn %d: the relays keep their default limits.max_streams_per_connection, %d", cfg.StreamsPerConn, relayStreamsPerConn)
	}
	return cfg.Validate()
}

// Rolling is what a rolling restart measured.
type Rolling struct {
	Config   Config           `json:"config"`
	Restarts []RollingRestart `json:"restarts"`
	// Changes the control plane published, and the clients' streams that
	// failed (each relay's, when it was restarted).
	Changes        int64 `json:"changes"`
	StreamFailures int64 `json:"stream_failures"`
	// Ending is how the clients ended; Ended tells whether they were
	// looked at (not if a restart failed).
	Ending   Ending   `json:"ending"`
	Ended    bool     `json:"ended"`
	Passed   bool     `json:"passed"`
	Failures []string `json:"failures,omitempty"`
	// Dir holds the relays' configurations and logs, kept if it failed.
	Dir string `json:"dir,omitempty"`
}

// RollingRestart is one relay's restart.
type RollingRestart struct {
	Relay   string `json:"relay"`
	Streams int    `json:"streams"` // the relay's open streams at SIGTERM
	Exit    int    `json:"exit"`    // its exit code
	// ShutdownTook is from SIGTERM to the relay's exit.
	ShutdownTook time.Duration `json:"shutdown_ns"`
	// Ended counts the client streams that ended (the relay's), GoAway
	// those whose connection ended after a GOAWAY, Back the clients
	// answered again on a new stream, Retried those whose first new
	// stream (or more) failed before one was answered.
	Ended      int    `json:"ended"`
	GoAway     int    `json:"goaway"`
	Back       int    `json:"back"`
	Retried    int    `json:"retried"`
	FirstError string `json:"first_error,omitempty"` // a stream's end, as its client read it
	// Drain is from SIGTERM to each stream's end; Gap from a stream's end
	// to the first response on the client's next stream (its backoff
	// included); Answer from that stream's opening to its first response.
	Drain  Summary `json:"drain"`
	Gap    Summary `json:"reconnect"`
	Answer Summary `json:"answer"`
	// Other is the other relay's open streams once every client was back;
	// LeftOn the balancer's connections still open to this one then.
	Other  int `json:"other"`
	LeftOn int `json:"left_on"`
	// SavedServed is from the relay's start again to a client of its own
	// holding every name, its link to the control plane silent; SavedOK
	// tells that no name was older than at SIGTERM. CaughtUp is from the
	// link's return to that client holding the control plane's versions.
	SavedServed time.Duration `json:"saved_served_ns"`
	SavedOK     bool          `json:"saved_ok"`
	CaughtUp    time.Duration `json:"caught_up_ns"`
}

// judge sets Passed and Failures from the restarts, the ending and err,
// the run's error.
func (rl *Rolling) judge(err error) {
	rl.Failures = nil
	if err != nil {
		rl.Failures = append(rl.Failures, err.Error())
	}
	for _, rr := range rl.Restarts {
		rl.Failures = append(rl.Failures, rr.failures(rl.Config.Clients)...)
	}
	switch {
	case rl.Ended:
		rl.Failures = append(rl.Failures, rl.Ending.failures()...)
	case err == nil:
		rl.Failures = append(rl.Failures, "the clients' ending was not checked")
	}
	rl.Passed = len(rl.Failures) == 0
}

// failures says what did not hold in the restart, of clients.
func (rr *RollingRestart) failures(clients int) []string {
	var out []string
	fail := func(format string, a ...any) {
		out = append(out, fmt.Sprintf("relay %s: ", rr.Relay)+fmt.Sprintf(format, a...))
	}
	if rr.Exit != 0 {
		fail("exited %d after SIGTERM", rr.Exit)
	}
	if rr.Streams == 0 {
		fail("held no stream at SIGTERM")
	}
	if rr.Ended != rr.Streams {
		fail("%d client streams ended, it held %d", rr.Ended, rr.Streams)
	}
	if rr.GoAway != rr.Ended {
		fail("%d of %d streams ended without a GOAWAY first (%s)", rr.Ended-rr.GoAway, rr.Ended, rr.FirstError)
	}
	if rr.Back != rr.Ended {
		fail("%d of %d clients were not answered again", rr.Ended-rr.Back, rr.Ended)
	}
	if rr.Other != clients || rr.LeftOn != 0 {
		fail("the other relay held %d of %d streams once they were back, %d connections were left on this one", rr.Other, clients, rr.LeftOn)
	}
	if rr.SavedServed > 0 && !rr.SavedOK {
		fail("restarted, it served a version older than it held at SIGTERM")
	}
	return out
}

// WriteTable prints the restarts, the reconnect times and the verdict.
func (rl *Rolling) WriteTable(w io.Writer) error {
	c := &rl.Config
	api := "per-type services"
	if c.ADS {
		api = "ADS"
	}
	fmt.Fprintf(w, "xdsload rolling restart: %d %s clients (even ones delta, odd ones SotW, %s, %d to a connection) through two xdsrelay processes (%s) "+
		"behind a TCP balancer, each in front of go-control-plane (%s cache) through a link of its own, with cache.persist_dir; a resource changed every %s; "+
		"each relay in turn got SIGTERM and was started again, its link silent until it served its saved cache\n\n",
		c.Clients, c.Type, api, c.StreamsPerConn, c.Rolling.RelayBin, c.CPCache, c.UpdateEvery)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "relay\tstreams\texit\tshutdown (s)\tended\tGOAWAY first\tback\tretried\ton the other after\tdrain min (s)\tdrain max (s)\tsaved cache served (ms)\tnot older\tcaught up (ms)\t\n")
	for _, rr := range rl.Restarts {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.3f\t%d\t%d\t%d\t%d\t%d\t%.3f\t%.3f\t%s\t%v\t%s\t\n", rr.Relay, rr.Streams, rr.Exit, rr.ShutdownTook.Seconds(),
			rr.Ended, rr.GoAway, rr.Back, rr.Retried, rr.Other, rr.Drain.Min.Seconds(), rr.Drain.Max.Seconds(), ms(rr.SavedServed), rr.SavedOK, ms(rr.CaughtUp))
	}
	fmt.Fprintf(tw, "\nreconnect (ms)\tn\tmin\tp50\tp90\tp99\tmax\t\n")
	for _, rr := range rl.Restarts {
		summaryRow(tw, "relay "+rr.Relay+": stream end to next response", rr.Gap)
		summaryRow(tw, "relay "+rr.Relay+": next stream open to response", rr.Answer)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "\n%d changes, %d client streams ended in failure (the restarted relays', and retries)\n", rl.Changes, rl.StreamFailures)
	for _, rr := range rl.Restarts {
		if rr.FirstError != "" {
			fmt.Fprintf(w, "relay %s: a stream ended with: %s\n", rr.Relay, rr.FirstError)
		}
	}
	if rl.Ended {
		rl.Ending.write(w, c.Clients)
	}
	fmt.Fprintln(w)
	if rl.Passed {
		_, err := fmt.Fprintln(w, "rolling restart passed: every stream ended after a GOAWAY and its client was answered by the other relay; each relay served its saved cache at once; every client at the control plane's last version, no spurious removal")
		return err
	}
	_, err := fmt.Fprintf(w, "rolling restart FAILED: %s\n", strings.Join(rl.Failures, "; "))
	return err
}
