package main

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/xdsrelay/xdsrelay/internal/testcp"
	"github.com/xdsrelay/xdsrelay/relay"
)

// docs/operations.md's fleet on one host runs as written, but for its
// ports and its control plane (a go-control-plane server in this process
// in place of xdsload's): three relays from config.example.yaml and the
// environment each line sets, which see each other as a fleet, as the
// curl command of /debug/fleet shows.
func TestDocOperationsFleetOnOneHost(t *testing.T) {
	cmds := shellCommands(t, docBlock(t, "docs/operations.md", "sh", "XDSRELAY_FLEET_PEERS"))
	if len(cmds) != 5 || !slices.Equal(cmds[0].words[:3], []string{"go", "run", "./cmd/xdsload"}) || cmds[4].words[0] != "curl" {
		t.Fatalf("want xdsload, three relays and curl: %+v", cmds)
	}
	if !cmds[0].background || !strings.Contains(strings.Join(cmds[0].words, " "), "--serve-cp 127.0.0.1:21000 --cp-cache linear") {
		t.Fatalf("the control plane: %q", cmds[0].words)
	}
	cp := testcp.Start(t)
	moved := map[string]string{"127.0.0.1:21000": cp.Addr}
	for _, p := range []string{"21011", "21012", "21013", "21911", "21912", "21913"} {
		moved["127.0.0.1:"+p] = freeAddr(t)
	}
	move := func(s string) string {
		for from, to := range moved {
			s = strings.ReplaceAll(s, from, to)
		}
		return s
	}
	var rs []*relay.Relay
	for _, c := range cmds[1:4] {
		if got := relayArgs(t, c, ""); !c.background || !slices.Equal(got, []string{"--config", "config.example.yaml"}) {
			t.Fatalf("a relay: %q", c.words)
		}
		env := map[string]string{}
		for k, v := range c.env {
			env[k] = move(v)
		}
		rs = append(rs, bootReadmeEnv(t, env, func(_, s string) string { return s }))
	}
	args := slices.Clone(cmds[4].words[1:])
	for i, a := range args {
		args[i] = strings.Replace(a, "localhost:21911", rs[0].AdminAddr(), 1)
	}
	deadline := time.Now().Add(cliWait)
	for {
		var df relay.DebugFleet
		if err := json.Unmarshal(runCurl(t, args), &df); err != nil {
			t.Fatal(err)
		}
		if len(df.Members) == 3 && df.Self == moved["127.0.0.1:21011"] {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("/debug/fleet of the first relay: %+v, want the three members", df)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
