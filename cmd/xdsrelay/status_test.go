package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/xdsrelay/xdsrelay/internal/testcp"
	"github.com/xdsrelay/xdsrelay/relay"
)

// Against go-control-plane, whose versions are 64-hex hashes, status shows
// each client's one short version and its state in a short row: the
// version is the first digits of what a REST poll of the same resources
// answers as version_info, a client that rejects them is NACKED, and -o
// wide shows the resources' own versions.
func TestStatusShortVersions(t *testing.T) {
	cp := testcp.Start(t)
	cp.Set(t, "c1", "1", testcp.Cluster("a"), testcp.Cluster("b"), testcp.Cluster("c"))
	cfg := relay.Default()
	cfg.Upstream.Address = cp.Addr
	cfg.Downstream.Address, cfg.Downstream.RESTAddress, cfg.Admin.Address = "127.0.0.1:0", "127.0.0.1:0", ""
	r := startRelayConfig(t, cfg)
	for _, args := range [][]string{{"--node-id", "acker"}, {"--node-id", "nacker", "--nack"}} {
		out := &syncBuffer{}
		stop := runAsync(t, out, append([]string{"watch", "--server", r.Addr(), "--cluster", "c1", "--type", "cds"}, args...)...)
		defer stop()
		waitForOutput(t, out, "name: c")
	}

	resp, err := http.Post("http://"+r.RESTAddr()+"/v3/discovery:clusters", "application/json",
		strings.NewReader(`{"node": {"id": "poller", "cluster": "c1"}}`))
	if err != nil {
		t.Fatal(err)
	}
	var poll struct {
		VersionInfo string `json:"versionInfo"`
	}
	err = json.NewDecoder(resp.Body).Decode(&poll)
	resp.Body.Close()
	if err != nil || len(poll.VersionInfo) != 24 {
		t.Fatalf("REST poll: %v, version_info %q", err, poll.VersionInfo)
	}

	var table string
	eventually(t, func() string { // the ACK and the NACK may be on their way
		var out, errOut bytes.Buffer
		if c := run(context.Background(), []string{"status", "--server", r.Addr()}, nil, &out, &errOut); c != 0 {
			return "exit " + errOut.String()
		}
		table = out.String()
		for _, row := range []string{`(?m)^acker\s+c1\s+CDS\s+` + poll.VersionInfo[:8] + `\s+SYNCED$`, `(?m)^nacker\s+c1\s+CDS\s+\S{8}\s+NACKED$`} {
			if !regexp.MustCompile(row).MatchString(table) {
				return "no row " + row + " in\n" + table
			}
		}
		return ""
	})
	for _, line := range strings.Split(strings.TrimSpace(table), "\n") {
		if len(line) > 60 {
			t.Errorf("a row of %d characters: %q", len(line), line)
		}
	}
	var wide, errOut bytes.Buffer
	if c := run(context.Background(), []string{"status", "--server", r.Addr(), "--node-id", "acker", "-o", "wide"}, nil, &wide, &errOut); c != 0 {
		t.Fatalf("-o wide: exit %d, %s", c, errOut.String())
	}
	if !regexp.MustCompile(`(?m)^acker\s+c1\s+CDS\s+` + poll.VersionInfo[:8] + `\s+SYNCED\s+[0-9a-f]{64},[0-9a-f]{64} \+1\s+3\s+0\s+0\s+0$`).MatchString(wide.String()) {
		t.Errorf("-o wide: want the resources' versions and counts:\n%s", wide.String())
	}
}
