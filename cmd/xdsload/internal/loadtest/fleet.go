package loadtest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/xdsrelay/xdsrelay/relay"
)

// A fleet run (RunFleet, xdsload --fleet N): N xdsrelay processes, the
// built binary (Config.Fleet.RelayBin), on loopback in front of the tool's
// control plane (in a child process of its own, so that its CPU is its
// own), the clients spread over Config.Fleet.Groups groups and over the
// relays. The same load runs twice: the relays not knowing each other,
// then as a fleet (fleet.peers, a static list). Each run measures the
// control plane's streams and its CPU per change, and the change-to-client
// latency; the fleet's run also the latency of the clients whose relay
// draws their group from its owner against the owner's own clients, then
// kills one relay (SIGKILL) and measures what its groups' move cost (new
// streams at the control plane, the time until each is fetched again,
// removals and resources sent again to the other relays' clients), then
// starts it again and samples each relay's clients while the fleet
// balances them (docs/architecture.md, "Fleet").

// Bounds of a fleet run's waits.
const (
	fleetReady    = time.Minute      // a relay ready, and in every view
	fleetSettle   = time.Minute      // the control plane's streams at what the run expects
	fleetDelivery = 30 * time.Second // every client holding an update
	fleetRefetch  = time.Minute      // every moved group fetched again
)

// fleetRelayYAML is a fleet run's relay: the production defaults but for
// its addresses, the grouping the clients share (node.cluster), no
// admission limits (a load test admits streams as fast as they come), and
// the fleet, or none.
const fleetRelayYAML = `upstream:
  address: %q
  group_by: [cluster]
downstream:
  address: %q
admin:
  address: %q
limits:
  stream_rate: 0
  max_streams: 0
  max_groups: 0
  max_streams_per_connection: 0
fleet:
  peers: %s
  self: %q
  refresh: 1s
log:
  level: info
  format: json
`

// fleetSetup is one run's control plane and relays.
type fleetSetup struct {
	cp     *child
	relays []*relayProc
	addrs  []string // the relays' xDS addresses
}

// startFleetSetup starts the control plane and n relays in dir, a fleet if
// fleet.
func startFleetSetup(cfg *Config, coding seqCoding, dir string, fleet bool) (s *fleetSetup, err error) {
	s = &fleetSetup{}
	defer func() {
		if err != nil {
			s.stop()
		}
	}()
	cpCfg := *cfg
	cpCfg.ServeCP, cpCfg.Target = "127.0.0.1:0", ""
	if s.cp, err = startChild(&cpCfg, coding, ""); err != nil {
		return s, err
	}
	ports, err := freePorts(2 * cfg.Fleet.Relays)
	if err != nil {
		return s, err
	}
	s.addrs = ports[:cfg.Fleet.Relays]
	peers := "[]"
	if fleet {
		peers = "[" + strings.Join(s.addrs, ", ") + "]"
	}
	for k, addr := range s.addrs {
		self := ""
		if fleet {
			self = addr
		}
		p, err := newFleetRelay(fmt.Sprintf("r%d", k), cfg.Fleet.RelayBin, dir, s.cp.target, addr, ports[cfg.Fleet.Relays+k], peers, self)
		if err != nil {
			return s, err
		}
		if err := p.start(); err != nil {
			return s, err
		}
		s.relays = append(s.relays, p)
	}
	return s, nil
}

// newFleetRelay writes relay name's configuration in dir.
func newFleetRelay(name, bin, dir, upstream, addr, admin, peers, self string) (*relayProc, error) {
	p := &relayProc{name: name, bin: bin, config: filepath.Join(dir, "relay-"+name+".yaml"),
		logFile: filepath.Join(dir, "relay-"+name+".log"), addr: addr, admin: admin}
	yaml := fmt.Sprintf(fleetRelayYAML, upstream, addr, admin, peers, self)
	if err := os.WriteFile(p.config, []byte(yaml), 0o600); err != nil {
		return nil, fmt.Errorf("relay %s: %w", name, err)
	}
	return p, nil
}

func (s *fleetSetup) stop() {
	for _, p := range s.relays {
		p.kill()
	}
	if s.cp != nil {
		s.cp.stop()
	}
}

// ready waits for every relay's /readyz and, in a fleet, for each to see
// them all.
func (s *fleetSetup) ready(ctx context.Context, fleet bool) error {
	for _, p := range s.relays {
		if err := p.waitReady(ctx, fleetReady); err != nil {
			return err
		}
		if !fleet {
			continue
		}
		err := waitFor(ctx, fleetReady, func() bool {
			df, err := debugFleet(p.admin)
			return err == nil && len(df.Members) == len(s.relays)
		}, func() string { return "relay " + p.name + " does not see every member" })
		if err != nil {
			return err
		}
	}
	return nil
}

// streams is the control plane's streams open by group, and those ever
// opened.
func (s *fleetSetup) streams() (map[string]int, int, error) {
	reply, err := s.cp.do(childCommand{Op: "streams"})
	return reply.Streams, reply.Opened, err
}

// settle waits until the control plane holds want streams for each group.
func (s *fleetSetup) settle(ctx context.Context, groups, want int) error {
	var by map[string]int
	return waitFor(ctx, fleetSettle, func() bool {
		var err error
		if by, _, err = s.streams(); err != nil {
			return false
		}
		for g := range groups {
			if by[groupName(g)] != want {
				return false
			}
		}
		return true
	}, func() string { return fmt.Sprintf("the control plane's streams by group %v, want %d each", by, want) })
}

// debugFleet reads a relay's /debug/fleet (its admin endpoint is loopback:
// private).
func debugFleet(admin string) (*relay.DebugFleet, error) {
	resp, err := scrapeClient.Get("http://" + admin + "/debug/fleet")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, errors.New(resp.Status)
	}
	var df relay.DebugFleet
	return &df, json.NewDecoder(resp.Body).Decode(&df)
}

// RunFleet runs the fleet run cfg describes (cfg.Fleet) and returns what
// it measured; it fails if a bound passed or a goal of the fleet was not
// met (Fleet.Failures).
func RunFleet(ctx context.Context, cfg Config) (*Fleet, error) {
	cfg, err := prepare(cfg, (*Config).ValidateFleet)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	// The updates, then one after the kill.
	coding := newSeqCoding(kinds[cfg.Type], cfg.Updates+1)
	dir, err := os.MkdirTemp("", "xdsload-fleet-")
	if err != nil {
		return nil, err
	}
	fl := &Fleet{Config: cfg, Dir: dir}
	for _, fleet := range []bool{false, true} {
		if err = fl.phase(ctx, &cfg, coding, dir, fleet); err != nil {
			break
		}
	}
	fl.judge(err)
	if !fl.Passed {
		err = errors.Join(err, fmt.Errorf("fleet: %s (the relays' logs are in %s)", strings.Join(fl.Failures, "; "), dir))
	} else {
		fl.Dir = ""
		_ = os.RemoveAll(dir)
	}
	return fl, err
}

// phase runs the load once, without the fleet or with it.
func (fl *Fleet) phase(ctx context.Context, cfg *Config, coding seqCoding, dir string, fleet bool) error {
	sub := filepath.Join(dir, map[bool]string{false: "apart", true: "fleet"}[fleet])
	if err := os.Mkdir(sub, 0o700); err != nil {
		return err
	}
	s, err := startFleetSetup(cfg, coding, sub, fleet)
	if err != nil {
		return err
	}
	defer s.stop()
	if err := s.ready(ctx, fleet); err != nil {
		return err
	}
	fc := newFleetClients(cfg, coding, s.addrs)
	cctx, stopClients := context.WithCancel(ctx)
	defer func() {
		stopClients()
		fc.wg.Wait()
	}()
	fc.start(cctx, cfg.Rate)
	run := &FleetRun{}
	if fleet {
		fl.With = run
	} else {
		fl.Without = run
	}
	if err := fc.waitHave(ctx, 0, fleetSettle); err != nil {
		return fmt.Errorf("first configs: %w", err)
	}
	want := 1
	if !fleet {
		want = cfg.Fleet.Relays
	}
	if err := s.settle(ctx, cfg.Fleet.Groups, want); err != nil {
		return err
	}
	if err := run.measure(ctx, cfg, s, fc); err != nil {
		return err
	}
	if !fleet {
		return nil
	}
	if err := fl.Hop.measure(s, fc, run.pub); err != nil {
		return err
	}
	if err := fl.Kill.measure(ctx, cfg, s, fc); err != nil {
		return err
	}
	return fl.balance(ctx, cfg, s, fc)
}
