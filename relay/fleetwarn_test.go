package relay

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/xdsrelay/xdsrelay/fleet"
	"github.com/xdsrelay/xdsrelay/internal/testcp"
)

// loggedFleetMember starts member i of addrs with its log (info and up) in
// a buffer.
func loggedFleetMember(t *testing.T, cp *testcp.ControlPlane, addrs []string, i int, mutate ...func(*Config)) (*Relay, *logBuffer) {
	t.Helper()
	log := &logBuffer{}
	r := startRelayLogged(t, cp.Addr, slog.New(slog.NewJSONHandler(log, nil)), append([]func(*Config){inFleet(addrs, i, nil)}, mutate...)...)
	return r, log
}

// peerStatus is r's /debug/fleet entry for the member at addr.
func peerStatus(t *testing.T, r *Relay, addr string) fleet.PeerStatus {
	t.Helper()
	var df DebugFleet
	getJSON(t, r, "/debug/fleet", &df)
	for _, p := range df.Peers {
		if p.Addr == addr {
			return p
		}
	}
	t.Fatalf("/debug/fleet of %s lists no %s: %+v", r.Addr(), addr, df.Peers)
	return fleet.PeerStatus{}
}

// A fleet set up wrong is said, not silent: a member whose peers do not
// answer (their certificates name no identity of fleet.peer_identities;
// or nothing listens at a listed address) logs one warning per peer with
// the error, shows it in /debug/fleet's last_error, and counts the peer in
// xdsrelay_fleet_unreachable_peers; the warning is not repeated while
// nothing changes.
func TestFleetSetUpWrongIsSaid(t *testing.T) {
	for _, tc := range []struct {
		name    string
		start   int // how many of the members run
		mutate  func(ca *testCA) []func(*Config)
		errText string
	}{
		{name: "peer identities that match no certificate", start: 2, errText: "fleet.peer_identities",
			mutate: func(ca *testCA) []func(*Config) {
				return []func(*Config){fleetTLS(ca), func(c *Config) { c.Fleet.PeerIdentities = []string{"not-the-peers"} }}
			}},
		{name: "a listed peer that never answers", start: 1, errText: "connect",
			mutate: func(*testCA) []func(*Config) { return nil }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cp := testcp.Start(t)
			addrs := fleetAddrs(fleetPort(t), 2)
			mutate := tc.mutate(newTestCA(t))
			var rs []*Relay
			var logs []*logBuffer
			for i := range tc.start {
				r, log := loggedFleetMember(t, cp, addrs, i, mutate...)
				rs, logs = append(rs, r), append(logs, log)
			}
			for i, r := range rs {
				other := addrs[1-i]
				eventually(t, "the unreachable peer counted on "+r.Addr(), func() bool {
					return value(scrape(t, r), "xdsrelay_fleet_unreachable_peers", nil) == 1
				})
				p := peerStatus(t, r, other)
				if p.Live || !strings.Contains(p.LastError, tc.errText) {
					t.Fatalf("/debug/fleet of %s on %s: %+v, want not live, last_error naming %q", r.Addr(), other, p, tc.errText)
				}
				eventually(t, "the warning on "+r.Addr(), func() bool { return len(logs[i].Lines(t, fleet.MsgNoAnswer)) > 0 })
			}
			time.Sleep(300 * time.Millisecond) // six rounds more (fleet.refresh 50ms)
			for i, r := range rs {
				// The first member may first be refused, before the other listens.
				lines, said := logs[i].Lines(t, fleet.MsgNoAnswer), 0
				for _, l := range lines {
					if l["member"] == addrs[1-i] && strings.Contains(l["error"].(string), tc.errText) {
						said++
					}
				}
				if said != 1 || len(lines) > 2 {
					t.Fatalf("%s logged %v, want one warning naming %s and %q", r.Addr(), lines, addrs[1-i], tc.errText)
				}
			}
		})
	}
}

// A member that goes is logged once by each other member, at the fleet
// level, and once as it comes back; the peer streams that ended with it
// are not each logged as a control plane's stream.
func TestFleetMemberDownIsLoggedOnce(t *testing.T) {
	cp := testcp.Start(t)
	groups := fleetGroups(t, cp, 6, 1)
	addrs := fleetAddrs(fleetPort(t), 3)
	var rs []*Relay
	var logs []*logBuffer
	for i := range addrs {
		r, log := loggedFleetMember(t, cp, addrs, i)
		rs, logs = append(rs, r), append(logs, log)
	}
	for _, r := range rs {
		eventually(t, "every member in the view of "+r.Addr(), func() bool { return len(viewOf(r)) == len(addrs) })
	}
	openFleetClients(t, rs, groups, 1)
	checkSources(t, rs, groups)

	shutdown(t, rs[2])
	for _, r := range rs[:2] {
		eventuallyWithin(t, 4*fleetTimeout+wait, "the stopped member out of the view of "+r.Addr(), func() bool { return len(viewOf(r)) == 2 })
	}
	rs[2] = tierRestart(t, addrs[2], cp.Addr, inFleet(addrs, 2, nil))
	for _, r := range rs[:2] {
		eventually(t, "the member back in the view of "+r.Addr(), func() bool { return len(viewOf(r)) == 3 })
	}
	for i, r := range rs[:2] {
		if left := logs[i].Lines(t, fleet.MsgLeft); len(left) != 1 || left[0]["member"] != addrs[2] {
			t.Errorf("%s logged the member leaving %d times: %v", r.Addr(), len(left), left)
		}
		if joined := logs[i].Lines(t, fleet.MsgJoined); countMember(joined, addrs[2]) != 2 { // as it first answered, and back
			t.Errorf("%s logged the member answering %d times, want 2: %v", r.Addr(), countMember(joined, addrs[2]), joined)
		}
		for _, msg := range []string{"upstream stream ended; reconnecting", "control plane server speaks delta"} {
			for _, l := range logs[i].Lines(t, msg) {
				if l["upstream"] == "fleet" || l["server"] == addrs[2] {
					t.Errorf("%s logged a peer stream as a control plane's: %v", r.Addr(), l)
				}
			}
		}
	}
}

func countMember(lines []map[string]any, addr string) int {
	n := 0
	for _, l := range lines {
		if l["member"] == addr {
			n++
		}
	}
	return n
}

// A fleet.self that is another member's address is said by both members,
// and the member so set up opens no peer stream to itself: the address it
// is reached at answers as it, and is left out of its view.
func TestFleetWrongSelfIsSaid(t *testing.T) {
	cp := testcp.Start(t)
	groups := fleetGroups(t, cp, 6, 1)
	addrs := fleetAddrs(fleetPort(t), 2)
	good, goodLog := loggedFleetMember(t, cp, addrs, 0)
	wrong, wrongLog := loggedFleetMember(t, cp, addrs, 1, func(c *Config) { c.Fleet.Self = addrs[0] })
	eventually(t, "the address that answers as the wrong member known as such", func() bool {
		return peerStatus(t, wrong, addrs[1]).ThisReplica
	})
	eventually(t, "the wrong member's name seen by the other", func() bool {
		return peerStatus(t, good, addrs[1]).NamesItself == addrs[0]
	})
	openFleetClients(t, []*Relay{wrong}, groups, 1)
	for _, g := range groups {
		if p, _, _ := wrong.groupOf(keyOf(g)).sw.Serving(); p.Name != directPath {
			t.Fatalf("%s on the wrong member is drawn from %s", g, p.Name)
		}
	}
	if v := viewOf(wrong); len(v) != 1 {
		t.Fatalf("the wrong member's view %v holds more than the one it takes for itself", v)
	}
	time.Sleep(300 * time.Millisecond) // rounds more: said once
	for _, c := range []struct {
		log  *logBuffer
		msg  string
		want int
	}{
		{wrongLog, fleet.MsgThisReplica, 1},
		{goodLog, fleet.MsgOtherName, 1},
	} {
		if n := len(c.log.Lines(t, c.msg)); n != c.want {
			t.Errorf("%q logged %d times, want %d", c.msg, n, c.want)
		}
	}
}

// Members configured otherwise (another upstream.group_by) are said once,
// and shown in /debug/fleet; a replica that lists a member the member
// does not list is said once by it.
func TestFleetDifferencesAreSaid(t *testing.T) {
	cp := testcp.Start(t)
	addrs := fleetAddrs(fleetPort(t), 3)
	// The first two list each other alone.
	first, firstLog := loggedFleetMember(t, cp, addrs[:2], 0)
	loggedFleetMember(t, cp, addrs[:2], 1, func(c *Config) { c.Upstream.GroupBy = []string{"cluster", "metadata.team"} })
	loggedFleetMember(t, cp, addrs, 2) // lists all three
	eventually(t, "the other configuration shown", func() bool {
		return strings.Contains(peerStatus(t, first, addrs[1]).ConfigDiffers, "metadata.team")
	})
	eventually(t, "the unlisted member said", func() bool { return len(firstLog.Lines(t, fleet.MsgUnlisted)) > 0 })
	time.Sleep(300 * time.Millisecond) // rounds more: said once
	if n := len(firstLog.Lines(t, fleet.MsgConfigDiffers)); n != 1 {
		t.Errorf("the other configuration said %d times, want 1", n)
	}
	if lines := firstLog.Lines(t, fleet.MsgUnlisted); len(lines) != 1 || lines[0]["caller"] != addrs[2] {
		t.Errorf("the unlisted member said %v, want once, naming %s", lines, addrs[2])
	}
}
