package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	typepb "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/xdsrelay/xdsrelay/relay"
)

// docs/protection.md's canary rehearsal, run as written against the relay
// of the quick start (only its ports moved): the canary `xdsrelay watch
// --nack-matching` NACKs the change, the fleet does not get it, /readyz
// and `rollout release` print what the doc shows, and then the fleet gets
// it.
func TestDocCanaryRehearsal(t *testing.T) {
	cmds := shellCommands(t, docBlock(t, "docs/protection.md", "sh", "--nack-matching"))
	if len(cmds) != 3 {
		t.Fatalf("the rehearsal's first block: %d commands, want 3", len(cmds))
	}
	r := bootReadmeEnv(t, cmds[0].env, func(_, content string) string { return content })
	moved := func(c shellCommand) []string {
		args := relayArgs(t, c, r.Addr())
		for i, a := range args {
			if a == "localhost:9901" {
				args[i] = r.AdminAddr()
			}
		}
		return args
	}
	canaryOut, canaryErr, fleetOut := &syncBuffer{}, &syncBuffer{}, &syncBuffer{}
	startRun(t, moved(cmds[1]), nil, canaryOut, canaryErr)
	waitForOutput(t, canaryOut, `connectTimeout: 1s`)
	startRun(t, moved(cmds[2]), nil, fleetOut, &syncBuffer{})
	waitForOutput(t, fleetOut, `connectTimeout: 1s`)

	file := filepath.Join("examples", "resources", "greeter.yaml")
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, file, replaceOnce(t, string(b), "connect_timeout: 1s", "connect_timeout: 5s"))
	waitForOutput(t, canaryOut, `connectTimeout: 5s`)
	waitForOutput(t, canaryErr, regexp.QuoteMeta(`watch: NACKed version `)+`.*`+regexp.QuoteMeta(`--nack-matching "connectTimeout":"5s" matches`))

	readyz := shellCommands(t, docBlock(t, "docs/protection.md", "sh", " /readyz"))
	degraded := strings.TrimSpace(docBlock(t, "docs/protection.md", "text", "DEGRADED"))
	eventually(t, func() string {
		if _, out, _ := runCLI(moved(readyz[0])...); !strings.Contains(out, degraded) {
			return fmt.Sprintf("/readyz: %q, the doc shows %q", out, degraded)
		}
		return ""
	})
	if strings.Contains(fleetOut.String(), "connectTimeout: 5s") {
		t.Fatal("the fleet was sent the change the canary NACKed")
	}

	list := shellCommands(t, docBlock(t, "docs/protection.md", "sh", "rollout list"))
	listed := docBlock(t, "docs/protection.md", "text", "NACKED BY")
	code, out, errOut := runCLI(moved(list[0])...)
	if rfc3339.ReplaceAllString(out, "TIME") != rfc3339.ReplaceAllString(listed, "TIME") {
		t.Errorf("rollout list: exit %d, %q %q; the doc shows %q", code, out, errOut, listed)
	}

	release := shellCommands(t, docBlock(t, "docs/protection.md", "sh", "rollout release"))
	code, out, errOut = runCLI(moved(release[0])...)
	if shown := strings.TrimSpace(docBlock(t, "docs/protection.md", "text", "released a change")); code != 0 || !strings.HasPrefix(out, shown) {
		t.Fatalf("rollout release: exit %d, %q %q; the doc shows %q", code, out, errOut, shown)
	}
	waitForOutput(t, fleetOut, `connectTimeout: 5s`)
}

// rfc3339 is a time as the commands' tables print it.
var rfc3339 = regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ`)

// `xdsrelay watch --user-agent --client-feature` lands in the group of the
// Envoy it stands in for: one group, two clients.
func TestWatchPosesAsEnvoy(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "c0.yaml"), clusterFile("c0"))
	r := startFileRelay(t, dir, func(c *relay.Config) { c.Admin.Address = "127.0.0.1:0" })
	features := []string{"envoy.lb.does_not_support_overprovisioning", "envoy.lrs.supports_send_all_clusters"}
	envoy := &corepb.Node{Id: "envoy-1", Cluster: "c1", UserAgentName: "envoy", ClientFeatures: features,
		UserAgentVersionType: &corepb.Node_UserAgentBuildVersion{UserAgentBuildVersion: &corepb.BuildVersion{
			Version: &typepb.SemanticVersion{MajorNumber: 1, MinorNumber: 31, Patch: 0}}}}
	st := sotwADS(t, r.Addr(), cliWait)
	if err := st.Send(&discoverypb.DiscoveryRequest{Node: envoy, TypeUrl: resourcev3.ClusterType}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); err != nil {
		t.Fatal(err)
	}

	out := &syncBuffer{}
	stop := runAsync(t, out, "watch", "--server", r.Addr(), "--node-id", "watcher", "--cluster", "c1", "--type", "cds",
		"--user-agent", "envoy/1.31.0", "--client-feature", features[1], "--client-feature", features[0])
	waitForOutput(t, out, "name: c0")
	_, groups, _ := runCLI("admin", "--admin", r.AdminAddr(), "/debug/groups")
	if n := strings.Count(groups, `"key"`); n != 1 || !strings.Contains(groups, `"clients": 2`) || !strings.Contains(groups, `"user_agent": "envoy/1.31"`) {
		t.Errorf("/debug/groups: %d groups, want one of two clients with user agent envoy/1.31 (kinds are MAJOR.MINOR):\n%s", n, groups)
	}
	if c := stop(); c != 0 {
		t.Fatalf("watch: exit %d", c)
	}
}

// watch --nack rejects every response on either protocol: the server
// records the NACK with watch's error, and watch says so on stderr.
func TestWatchNacks(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "c0.yaml"), clusterFile("c0"))
	r := startFileRelay(t, dir, func(c *relay.Config) { c.Admin.Address = "127.0.0.1:0" })
	for _, tc := range []struct {
		variant string
		args    []string
		stderr  string
	}{
		{"sotw-ads", nil, `watch: NACKed version \S+ \(nonce \S+\): --nack rejects every response`},
		{"delta-ads", []string{"--delta"}, `watch: NACKed nonce \S+: --nack rejects every response`},
	} {
		out, errOut := &syncBuffer{}, &syncBuffer{}
		stop := startRun(t, append([]string{"watch", "--server", r.Addr(), "--node-id", "n-" + tc.variant, "--cluster", "c1", "--type", "cds", "--nack"}, tc.args...), nil, out, errOut)
		waitForOutput(t, out, "name: c0")
		waitForOutput(t, errOut, tc.stderr)
		nacked := regexp.MustCompile(`"variant": "` + tc.variant + `",[^\]]*"last_nack_error": "xdsrelay watch: --nack rejects every response"`)
		eventually(t, func() string {
			if _, clients, _ := runCLI("admin", "--admin", r.AdminAddr(), "/debug/clients"); !nacked.MatchString(clients) {
				return fmt.Sprintf("%s: /debug/clients shows no NACK from watch:\n%s", tc.variant, clients)
			}
			return ""
		})
		if c := stop(); c != 0 {
			t.Errorf("%s: exit %d", tc.variant, c)
		}
	}
}
