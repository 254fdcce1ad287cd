package main

import (
	"net/url"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/xdsrelay/xdsrelay/internal/xds"
	"github.com/xdsrelay/xdsrelay/relay"
)

// Every command and admin path that takes a resource type takes each of
// its names: the type URL, the message name, the xDS abbreviation in any
// case and the REST short name; and refuses another with one error that
// lists them.
func TestCLITypeNames(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "c0.yaml"), clusterFile("c0"))
	r := startFileRelay(t, dir, func(c *relay.Config) { c.Admin.Address = "127.0.0.1:0" })
	const group = "cluster=c1,user_agent=,client_features="
	for _, name := range []string{"Cluster", "cluster", "cds", "CDS", "clusters", "Clusters", resourcev3.ClusterType} {
		out := &syncBuffer{}
		stop := runAsync(t, out, "watch", "--server", r.Addr(), "--node-id", "n1", "--cluster", "c1", "--type", name)
		waitForOutput(t, out, regexp.QuoteMeta("name: c0"))
		if c := stop(); c != 0 {
			t.Fatalf("watch --type %s: exit %d", name, c)
		}
		q := url.Values{"group": {group}, "type": {name}}
		if c, out, errOut := runCLI("admin", "--admin", r.AdminAddr(), "/debug/cache?"+q.Encode()); c != 0 || !strings.Contains(out, `"name": "c0"`) {
			t.Errorf("admin /debug/cache type=%s: exit %d, stdout %q, stderr %q", name, c, out, errOut)
		}
		for _, cmd := range []string{"guard", "rollout"} {
			if c, out, errOut := runCLI(cmd, "release", "--server", r.AdminAddr(), "--type", name); c != 0 || out != "nothing was held\n" {
				t.Errorf("%s release --type %s: exit %d, stdout %q, stderr %q", cmd, name, c, out, errOut)
			}
		}
	}

	const list = `"bogus" is not a resource type: Cluster|CDS|clusters, ClusterLoadAssignment|EDS|endpoints, LbEndpoint|LEDS|lb-endpoints, Listener|LDS|listeners, RouteConfiguration|RDS|routes, ScopedRouteConfiguration|SRDS|scoped-routes, VirtualHost|VHDS|virtual-hosts, Secret|SDS|secrets, Runtime|RTDS|runtime, TypedExtensionConfig|ECDS|extension_configs, in any case, or a type URL (type.googleapis.com/envoy.config.cluster.v3.Cluster)`
	for _, args := range [][]string{
		{"watch", "--server", r.Addr(), "--node-id", "n1", "--type", "bogus"},
		{"guard", "release", "--admin", r.AdminAddr(), "--type", "bogus"},
		{"rollout", "release", "--admin", r.AdminAddr(), "--type", "bogus"},
	} {
		if c, _, errOut := runCLI(args...); c != 2 || errOut != "xdsrelay: --type: "+list+" (see xdsrelay "+commandPath(args)+" --help)\n" {
			t.Errorf("%q: exit %d, stderr %q", args, c, errOut)
		}
	}
	q := url.Values{"group": {group}, "type": {"bogus"}}
	if c, _, errOut := runCLI("admin", "--admin", r.AdminAddr(), "/debug/cache?"+q.Encode()); c != 1 || !strings.Contains(errOut, "400 Bad Request") || !strings.Contains(errOut, "xdsrelay: type: "+list) {
		t.Errorf("admin /debug/cache type=bogus: exit %d, stderr %q", c, errOut)
	}
	if c, _, errOut := runCLI("admin", "--admin", r.AdminAddr(), "-X", "POST", "/debug/guard/release?type=bogus"); c != 1 || !strings.Contains(errOut, "xdsrelay: type: "+list) {
		t.Errorf("admin POST /debug/guard/release?type=bogus: exit %d, stderr %q", c, errOut)
	}
}

// commandPath is the command a test's command line runs: its words before
// the first flag.
func commandPath(args []string) string {
	var words []string
	for _, a := range args {
		if strings.HasPrefix(a, "-") {
			break
		}
		words = append(words, a)
	}
	return strings.Join(words, " ")
}

// docs/cli.md's table of resource types has a row per type, every name in
// it one that the parser takes for that type.
func TestCLIDocTypeNames(t *testing.T) {
	text := docText(t, "docs/cli.md")
	for _, typeURL := range xds.Types {
		row := regexp.MustCompile("(?m)^\\| `" + regexp.QuoteMeta(xds.ShortName(typeURL)) + "` \\|.*$").FindString(text)
		if !strings.Contains(row, "`"+typeURL+"`") {
			t.Errorf("docs/cli.md: no row for %s with its type URL: %q", typeURL, row)
			continue
		}
		for _, m := range regexp.MustCompile("`([^`]+)`").FindAllStringSubmatch(row, -1) {
			if got, err := xds.ParseType(m[1]); got != typeURL {
				t.Errorf("docs/cli.md: %s's row names %q: ParseType = %q, %v", typeURL, m[1], got, err)
			}
		}
	}
}
