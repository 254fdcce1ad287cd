package main

import (
	"strings"
	"testing"
	"time"

	"github.com/xdsrelay/xdsrelay/internal/testcp"
	"github.com/xdsrelay/xdsrelay/relay"
)

// startFleetMembers starts n relays in front of upstream that know each
// other by a static fleet.peers list, each advertising its admin endpoint,
// and waits until each draws the group of cluster c1 (if it has it) in
// step with the others.
func startFleetMembers(t *testing.T, upstream string, n int) []*relay.Relay {
	t.Helper()
	var addrs []string
	for range n {
		addrs = append(addrs, freeAddr(t))
	}
	var rs []*relay.Relay
	for i := range n {
		cfg := relay.Default()
		cfg.Upstream.Address = upstream
		cfg.Upstream.ReconnectBaseDelay, cfg.Upstream.ReconnectMaxDelay = 20*time.Millisecond, 100*time.Millisecond
		cfg.Upstream.ConnectTimeout = time.Second
		cfg.Downstream.Address = addrs[i]
		cfg.Admin.Address = freeAddr(t)
		cfg.Admin.AdvertiseAddress = cfg.Admin.Address
		cfg.Fleet.Peers, cfg.Fleet.Self, cfg.Fleet.Refresh = addrs, addrs[i], 50*time.Millisecond
		rs = append(rs, startRelayConfig(t, cfg))
	}
	return rs
}

// A fleet's members are each other's clients. `wait --tiers`, given every
// member, follows each group to where it is drawn from: the members that
// draw it from its owner are taken out of the owner's count and their own
// clients counted in their place, so it counts the clients, not the peer
// streams. Without --tiers a peer stream is not a client either: each
// member counts its own, and the peer streams are said apart. `status
// --summary` says where each group comes from, and its peer streams.
func TestWaitTiersFollowsTheFleet(t *testing.T) {
	cp := testcp.Start(t)
	cp.Set(t, "c1", "1", timedCluster(time.Second))
	rs := startFleetMembers(t, cp.Addr, 3)
	var clients []*judge
	for i, r := range rs {
		clients = append(clients, acceptingClient(t, r.Addr(), "node-"+string(rune('a'+i))))
	}
	for _, j := range clients {
		j.wait(t, "1s")
	}
	args := []string{"wait", "--type", "clusters", "--timeout", "20s"}
	for _, r := range rs {
		args = append(args, "--admin", r.AdminAddr())
	}
	// Once the two other members draw c1 from its owner: 3 clients and
	// 2 peer streams.
	deadline := time.Now().Add(cliWait)
	for {
		code, out, errOut := runCLI(args...)
		if code == 0 && out == "3 of 3 clients accepted (2 fleet peer streams not counted as clients)\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("wait over the members: exit %d, %q %q", code, out, errOut)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if code, out, errOut := runCLI(append(args, "--tiers")...); code != 0 || out != "3 of 3 clients accepted (2 fleet peer streams not counted as clients)\n" {
		t.Fatalf("wait --tiers over the members: exit %d, %q %q", code, out, errOut)
	}

	// Each member's FROM: the owner's control-plane, the others' the
	// owner, once every path has settled.
	deadline = time.Now().Add(cliWait)
	for {
		from := map[*relay.Relay]string{}
		var owner *relay.Relay
		for _, r := range rs {
			code, out, errOut := runCLI("status", "--summary", "--admin", r.AdminAddr())
			if code != 0 || !strings.Contains(out, "FROM") {
				t.Fatalf("status --summary: exit %d, %s%s", code, out, errOut)
			}
			lines := strings.Split(strings.TrimSpace(out), "\n")
			fields := strings.Fields(lines[len(lines)-1])
			from[r] = strings.Join(fields[10:], " ")
			if peers := fields[9]; (from[r] == "control-plane") != (peers == "2") {
				t.Fatalf("status --summary on %s: %s peer streams with FROM %s", r.Addr(), peers, from[r])
			}
			if from[r] == "control-plane" {
				owner = r
			}
		}
		settled := owner != nil
		for _, r := range rs {
			settled = settled && (r == owner || from[r] == "peer "+owner.Addr())
		}
		if settled {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("status --summary's FROM on each member: %v; want the owner's control-plane, the others' peer and the owner", from)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
