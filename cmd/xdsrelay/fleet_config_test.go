package main

import (
	"reflect"
	"testing"
	"time"
)

// The fleet.* keys in every shape they come in: from the file, from the
// environment, with the keys they need of others, and refused with an
// error that names the key.
func TestLoadFleetConfig(t *testing.T) {
	const peers = "fleet:\n  peers: [xdsrelay-peers.ns.svc:18001]\n  self: 10.0.0.5:18001\n"
	runLoadTests(t, []loadTest{
		{
			name: "off by default",
			check: func(t *testing.T, o Options) {
				f := o.Relay.Fleet
				if f.On() || f.Refresh != 5*time.Second || !f.Balance || f.BalanceSlack != 0.2 || f.ShedPerSecond != 5 {
					t.Errorf("defaults: %+v", f)
				}
			},
		},
		{
			name: "from the file",
			yaml: peers + "  refresh: 2s\n  balance: false\n  balance_slack: 0.5\n  shed_per_second: 10\n",
			check: func(t *testing.T, o Options) {
				f := o.Relay.Fleet
				if !reflect.DeepEqual(f.Peers, []string{"xdsrelay-peers.ns.svc:18001"}) || f.Self != "10.0.0.5:18001" ||
					f.Refresh != 2*time.Second || f.Balance || f.BalanceSlack != 0.5 || f.ShedPerSecond != 10 {
					t.Errorf("got %+v", f)
				}
			},
		},
		{
			name: "from the environment, as a Deployment sets it",
			env: map[string]string{"XDSRELAY_FLEET_PEERS": "10.0.0.5:18001, 10.0.0.6:18001", "XDSRELAY_FLEET_SELF": "10.0.0.6:18001",
				"XDSRELAY_FLEET_BALANCE_SLACK": "0.3"},
			check: func(t *testing.T, o Options) {
				f := o.Relay.Fleet
				if !reflect.DeepEqual(f.Peers, []string{"10.0.0.5:18001", "10.0.0.6:18001"}) || f.Self != "10.0.0.6:18001" || f.BalanceSlack != 0.3 {
					t.Errorf("got %+v", f)
				}
			},
		},
		{
			name: "with client certificates and the peers' identities",
			yaml: mtls + "  authorization:\n    rules: [{identity: \"spiffe://td/ns/{ns}/sa/*\", node: {cluster: \"{ns}\"}}]\n" + peers +
				"  peer_identities: [spiffe://td/ns/xdsrelay/sa/xdsrelay]\n",
			check: func(t *testing.T, o Options) {
				if !reflect.DeepEqual(o.Relay.Fleet.PeerIdentities, []string{"spiffe://td/ns/xdsrelay/sa/xdsrelay"}) {
					t.Errorf("got %+v", o.Relay.Fleet)
				}
			},
		},
		{name: "peers without self", yaml: "fleet:\n  peers: [a:18001]\n", wantErr: "fleet.self"},
		{name: "a peer without a port", env: map[string]string{"XDSRELAY_FLEET_PEERS": "relay", "XDSRELAY_FLEET_SELF": "10.0.0.1:1"}, wantErr: "fleet.peers"},
		{name: "self a wildcard", yaml: "fleet:\n  peers: [a:18001]\n  self: 0.0.0.0:18001\n", wantErr: "fleet.self"},
		{name: "refresh 0", yaml: peers + "  refresh: 0\n", wantErr: "fleet.refresh"},
		{name: "slack negative", yaml: peers + "  balance_slack: -1\n", wantErr: "fleet.balance_slack"},
		{name: "shed 0", yaml: peers + "  shed_per_second: 0\n", wantErr: "fleet.shed_per_second"},
		{name: "resource files", yaml: "upstream:\n  address: file:///etc/xds\n" + peers, wantErr: "fleet.peers"},
		{
			name:    "client certificates without the peers' identities",
			yaml:    mtls + "  authorization:\n    mode: allow-all\n" + peers,
			wantErr: "fleet.peer_identities",
		},
		{
			name:    "the peers' identities without client certificates",
			yaml:    peers + "  peer_identities: [spiffe://td/ns/xdsrelay/sa/xdsrelay]\n",
			wantErr: "fleet.peer_identities: set without downstream.tls.client_ca_file",
		},
		{
			name:    "self on another port than the xDS port",
			yaml:    "downstream:\n  address: 0.0.0.0:21021\n" + "fleet:\n  peers: [127.0.0.1:21021]\n  self: 127.0.0.1:21029\n",
			wantErr: "fleet.self: its port 21029 is not downstream.address's, 21021",
		},
		{
			name:    "an identity pattern",
			yaml:    mtls + "  authorization:\n    mode: allow-all\n" + peers + "  peer_identities: [\"spiffe://td/*\"]\n",
			wantErr: "fleet.peer_identities",
		},
	})
}
