package loadtest

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/xdsrelay/xdsrelay/relay"

	"github.com/xdsrelay/xdsrelay/internal/testcp"
)

// Protocol variants.
const (
	VariantDelta = "delta"
	VariantSotW  = "sotw"
)

// Control-plane caches.
const (
	CacheSnapshot = "snapshot"
	CacheLinear   = "linear"
)

// Config describes one run. The zero value of a field takes the default
// that Defaults documents.
type Config struct {
	Target  string `json:"target"`  // xDS server host:port; empty: the ServeCP control plane
	Clients int    `json:"clients"` // downstream clients, one xDS stream each
	// StreamsPerConn groups the clients' streams onto gRPC connections:
	// clients i*N..i*N+N-1 share connection i. 1: a connection each.
	StreamsPerConn int           `json:"streams_per_conn"`
	Rate           float64       `json:"rate"`         // streams opened per second at most; 0: no limit
	Variant        string        `json:"variant"`      // VariantDelta or VariantSotW
	ADS            bool          `json:"ads"`          // aggregated service, else the per-type service
	Type           string        `json:"type"`         // eds, cds, lds or rds
	Names          []string      `json:"names"`        // subscriptions; empty: wildcard
	NodeCluster    string        `json:"node_cluster"` // node.cluster sent by every client
	PID            int           `json:"pid"`          // server process whose RSS and CPU are sampled; 0: none
	Timeout        time.Duration `json:"timeout_ns"`   // bound on the whole run

	ServeCP string `json:"serve_cp"` // run a control plane on this address
	CPCache string `json:"cp_cache"` // CacheSnapshot or CacheLinear
	// CPProtocol is what the control plane speaks (testcp's dialects):
	// delta (and SotW, every service), sotw (ADS, delta refused) or
	// sotw-per-type (the per-type SotW services only).
	CPProtocol  string        `json:"cp_protocol"`
	Resources   int           `json:"resources"`       // resources the control plane serves
	Endpoints   int           `json:"endpoints"`       // endpoints per ClusterLoadAssignment
	UpdateEvery time.Duration `json:"update_every_ns"` // pause before each update
	Updates     int           `json:"updates"`         // updates published, one resource each

	Floor bool `json:"floor"` // measure the socket floor instead of an xDS server
	// GRPCFloor measures the gRPC floor instead: a bare grpc-go server on
	// the clients' xDS service that writes each stream, for its first config
	// and for each update, one response encoded ahead of time (the bytes
	// the relay would send), with no cache and no protocol state.
	GRPCFloor bool `json:"grpc_floor,omitempty"`
	// Relay starts xdsrelay in this process in front of the ServeCP
	// control plane, and the clients load the relay.
	Relay bool `json:"relay,omitempty"`
	// RelayLimits keeps the relay's default admission limits
	// (relay.Default().Limits: limits.stream_rate, max_streams,
	// max_groups, max_streams_per_connection, ...) instead of turning them
	// off; the clients then retry a stream refused with RESOURCE_EXHAUSTED
	// or UNAVAILABLE as Envoy does (envoyBackoff).
	RelayLimits bool `json:"relay_limits,omitempty"`
	// RelayPersist, if set, is the relay's cache.persist_dir (made if
	// missing), saved every second and on shutdown: a run restores what the
	// one before it saved, and its clients are served from that cache
	// before the control plane answers.
	RelayPersist string `json:"relay_persist,omitempty"`
	// RelayConsistencyOff turns the relay's make before break off
	// (consistency.max_wait: 0): references are then neither read into
	// waits nor fetched, to measure what they cost.
	RelayConsistencyOff bool `json:"relay_consistency_off,omitempty"`
	// RelayGroupBy is the relay's upstream.group_by; empty: [cluster],
	// every client in one group. [id] makes each client a group of its
	// own, as a control plane that tailors config per proxy (istiod,
	// Consul) needs.
	RelayGroupBy []string `json:"relay_group_by,omitempty"`
	// relayTune, if set, edits the in-process relay's configuration last
	// (tests: limits low enough to refuse a few clients). It does not
	// reach a split run's child.
	relayTune func(*relay.Config)

	// Split runs what serves the clients (the control plane, the relay in
	// front of it, or the floor's server) in a child process of its own:
	// the clients and the server then each have a whole open-file limit,
	// and the RSS sampled (unless PID is given) is the server's alone.
	Split bool `json:"split,omitempty"`

	// Churn, if positive, replaces the updates with connect/disconnect
	// churn for that long: every client loops opening a stream (and with
	// StreamsPerConn 1 its connection), subscribing, waiting for the first
	// response and closing. ChurnSettle is the pause after the last client
	// has stopped before the server's memory is sampled as settled.
	Churn       time.Duration `json:"churn_ns,omitempty"`
	ChurnSettle time.Duration `json:"churn_settle_ns,omitempty"`

	// Soak, if its Duration is set, replaces the updates with a soak of
	// the relay: see SoakConfig.
	Soak SoakConfig `json:"soak,omitzero"`

	// LRS runs load-reporting clients instead of xDS ones (RunLRS): each
	// opens one LRS stream to the target and reports every LRSInterval (the
	// interval the control plane names), for LRSFor once all report. The
	// control plane is the tool's (ServeCP); with Relay, the clients report
	// to the relay in front of it.
	LRS         bool          `json:"lrs,omitempty"`
	LRSInterval time.Duration `json:"lrs_interval_ns,omitempty"`
	LRSFor      time.Duration `json:"lrs_for_ns,omitempty"`

	// Rolling describes a rolling restart (RunRolling) of two xdsrelay
	// processes behind one address.
	Rolling RollingConfig `json:"rolling,omitzero"`

	// Fleet describes a fleet run (RunFleet): xdsrelay processes that know
	// each other, in front of the tool's control plane.
	Fleet FleetConfig `json:"fleet,omitzero"`

	// CPUProfile, if set, is a file that receives a CPU profile of this
	// process while the updates fan out: from every client configured to
	// the last update delivered (or the run's end). Compare writes one per
	// setup, the setup's name appended (FILE.relay, FILE.linear, ...).
	// Samples are labelled side=clients (the load clients) or side=server
	// (control plane, relay, floor server, publisher).
	CPUProfile string `json:"cpu_profile,omitempty"`

	Progress      io.Writer     `json:"-"` // a progress line every ProgressEvery; nil: none
	ProgressEvery time.Duration `json:"-"`
}

// Defaults returns cfg with the zero fields that have one set to their
// default: 100 clients, a connection each, delta, eds, node cluster "load", a 2m timeout, the
// snapshot cache with 10 resources of 200 endpoints, progress every second;
// a soak changes a resource every 2s, is bounded by its duration plus two
// minutes, and takes SoakConfig's defaults.
// A zero Rate means no limit, zero Updates none, a zero UpdateEvery back to
// back; ADS is left as it is. A churn run settles for 3s.
func (cfg Config) Defaults() Config {
	setDefault(&cfg.Clients, 100)
	setDefault(&cfg.StreamsPerConn, 1)
	setDefault(&cfg.ChurnSettle, 3*time.Second)
	setDefault(&cfg.Variant, VariantDelta)
	setDefault(&cfg.Type, "eds")
	setDefault(&cfg.NodeCluster, "load")
	setDefault(&cfg.CPCache, CacheSnapshot)
	setDefault(&cfg.CPProtocol, string(testcp.DialectDelta))
	setDefault(&cfg.Resources, 10)
	setDefault(&cfg.Endpoints, 200)
	setDefault(&cfg.ProgressEvery, time.Second)
	cfg = cfg.SoakDefaults()
	setDefault(&cfg.Timeout, 2*time.Minute)
	if cfg.LRS {
		setDefault(&cfg.LRSInterval, time.Second)
		setDefault(&cfg.LRSFor, 30*time.Second)
	}
	if cfg.Fleet.Relays > 0 {
		setDefault(&cfg.Fleet.Groups, 30)
		setDefault(&cfg.Fleet.BalanceFor, 2*time.Minute)
	}
	return cfg
}

// SoakDefaults returns cfg with, for a soak, the defaults that Defaults
// gives its zero fields; cfg as it is otherwise.
func (cfg Config) SoakDefaults() Config {
	if cfg.Soak.Duration > 0 {
		setDefault(&cfg.UpdateEvery, soakChangeEvery)
		setDefault(&cfg.Timeout, cfg.Soak.Duration+soakGrace)
		cfg.Soak = cfg.Soak.defaults()
	}
	return cfg
}

func setDefault[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}

// maxUpdates keeps the sequence number inside the field that carries it
// (a port, for endpoints).
const maxUpdates = 50000

// Validate reports the first problem with a defaulted cfg.
func (cfg *Config) Validate() error {
	switch {
	case cfg.Clients < 1:
		return errors.New("clients must be at least 1")
	case cfg.Rate < 0:
		return errors.New("rate must not be negative")
	case cfg.Variant != VariantDelta && cfg.Variant != VariantSotW:
		return fmt.Errorf("variant %q: want %s or %s", cfg.Variant, VariantDelta, VariantSotW)
	case kinds[cfg.Type].typeURL == "":
		return fmt.Errorf("type %q: want eds, cds, lds or rds", cfg.Type)
	case cfg.CPCache != CacheSnapshot && cfg.CPCache != CacheLinear:
		return fmt.Errorf("cp-cache %q: want %s or %s", cfg.CPCache, CacheSnapshot, CacheLinear)
	case !slices.Contains(testcp.Dialects, testcp.Dialect(cfg.CPProtocol)):
		return fmt.Errorf("cp-protocol %q: want delta, sotw or sotw-per-type", cfg.CPProtocol)
	case cfg.Resources < 1 || cfg.Endpoints < 1:
		return errors.New("resources and endpoints must be at least 1")
	case cfg.Updates < 0 || cfg.Updates > maxUpdates:
		return fmt.Errorf("updates must be between 0 and %d", maxUpdates)
	case cfg.Timeout <= 0 || cfg.UpdateEvery < 0:
		return errors.New("timeout must be positive and update-every not negative")
	case !cfg.Floor && !cfg.GRPCFloor && cfg.ServeCP == "" && cfg.Target == "":
		return errors.New("give a target, serve a control plane (serve-cp) or measure a floor (floor, grpc-floor)")
	case cfg.GRPCFloor && (cfg.Floor || cfg.Relay || cfg.ServeCP != "" || cfg.Target != ""):
		return errors.New("grpc-floor serves the clients itself: give neither target, serve-cp, relay nor floor")
	case cfg.Relay && (cfg.ServeCP == "" || cfg.Target != "" || cfg.Floor):
		return errors.New("relay runs in front of the serve-cp control plane: give serve-cp, and neither target nor floor")
	case cfg.Split && (cfg.Target != "" || !cfg.updating()):
		return errors.New("split runs the tool's own server in a child process: give serve-cp, floor or grpc-floor, and no target")
	}
	if err := cfg.validateStreams(); err != nil {
		return err
	}
	if err := cfg.validateRelay(); err != nil {
		return err
	}
	if err := cfg.validateDialect(); err != nil {
		return err
	}
	if err := cfg.Soak.validate(cfg); err != nil {
		return err
	}
	if err := cfg.validateLRS(); err != nil {
		return err
	}
	return cfg.validateNames()
}

// validateStreams checks --streams-per-conn and --churn.
func (cfg *Config) validateStreams() error {
	switch {
	case cfg.StreamsPerConn < 1:
		return fmt.Errorf("streams-per-conn %d: want at least 1", cfg.StreamsPerConn)
	case cfg.StreamsPerConn > 1 && cfg.Floor:
		return errors.New("streams-per-conn: the floor has one TCP connection per client; give streams-per-conn 1 with floor")
	case cfg.Churn < 0:
		return fmt.Errorf("churn %s: must not be negative", cfg.Churn)
	case cfg.Churn > 0 && cfg.Floor:
		return errors.New("churn: the floor does not churn; give churn without floor")
	case cfg.Churn > 0 && cfg.ChurnSettle < 0:
		return fmt.Errorf("churn-settle %s: must not be negative", cfg.ChurnSettle)
	case cfg.Churn > 0 && cfg.Timeout <= cfg.Churn+cfg.ChurnSettle:
		return fmt.Errorf("timeout %s: must be longer than churn %s plus churn-settle %s", cfg.Timeout, cfg.Churn, cfg.ChurnSettle)
	}
	return nil
}

// validateDialect checks that clients that reach the tool's control plane
// directly speak what --cp-protocol serves: one that refuses delta, or
// serves no ADS, is for a relay in front (--relay, --rolling), which finds
// its protocol; the clients would each be refused.
func (cfg *Config) validateDialect() error {
	direct := cfg.ServeCP != "" && !cfg.Relay && cfg.Rolling.RelayBin == "" && !cfg.LRS
	switch d := testcp.Dialect(cfg.CPProtocol); {
	case !direct || d == testcp.DialectDelta:
		return nil
	case cfg.Variant == VariantDelta:
		return fmt.Errorf("cp-protocol %s refuses delta: give relay, or variant sotw", d)
	case d == testcp.DialectPerType && cfg.ADS:
		return fmt.Errorf("cp-protocol %s serves no ADS: give relay, or ads=false", d)
	}
	return nil
}

// validateRelay checks the relay's options.
func (cfg *Config) validateRelay() error {
	switch {
	case (cfg.RelayLimits || cfg.RelayPersist != "" || cfg.RelayConsistencyOff || len(cfg.RelayGroupBy) > 0) && !cfg.Relay:
		return errors.New("relay-limits, relay-persist, relay-consistency-off and relay-group-by set up the relay: give relay (or compare)")
	case cfg.RelayLimits && cfg.StreamsPerConn > relayStreamsPerConn:
		// Streams past SETTINGS_MAX_CONCURRENT_STREAMS wait for a slot
		// that a long-lived xDS stream never frees.
		return fmt.Errorf("relay-limits: the relay's limits.max_streams_per_connection is %d; give streams-per-conn at most that", relayStreamsPerConn)
	}
	return nil
}

// validateLRS checks a load-report run's options.
func (cfg *Config) validateLRS() error {
	switch {
	case !cfg.LRS:
		return nil
	case cfg.ServeCP == "" || cfg.Target != "":
		return errors.New("lrs: the control plane's load reporting server is the tool's: give serve-cp, and no target")
	case cfg.Floor || cfg.GRPCFloor || cfg.Churn > 0 || cfg.Soak.Duration > 0:
		return errors.New("lrs: give neither floor, grpc-floor, churn nor soak")
	case cfg.LRSInterval <= 0 || cfg.LRSFor <= 0:
		return errors.New("lrs-interval and lrs-for must be positive")
	}
	return nil
}

// validateNames checks, when the tool serves the resources, that every
// subscribed name is one of them.
func (cfg *Config) validateNames() error {
	if cfg.ServeCP == "" && !cfg.Floor && !cfg.GRPCFloor {
		return nil
	}
	served := resourceNames(kinds[cfg.Type], cfg.Resources)
	for _, n := range cfg.Names {
		if !slices.Contains(served, n) {
			return fmt.Errorf("name %q is not served: the names are %s0..%s%d", n, kinds[cfg.Type].prefix, kinds[cfg.Type].prefix, cfg.Resources-1)
		}
	}
	return nil
}

// updating reports whether the run publishes updates.
func (cfg *Config) updating() bool { return cfg.ServeCP != "" || cfg.Floor || cfg.GRPCFloor }
