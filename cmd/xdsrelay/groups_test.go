package main

import (
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/xdsrelay/xdsrelay/relay"
)

// A group whose key is longer than an id (an Envoy's user agent and
// features) is named by one id in every command: groups maps it to the
// whole key, its client and its upstream, and status --summary and wait
// name it so.
func TestGroupsCommand(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "listener.yaml"), listenerFile("10001"))
	r := startFileRelay(t, dir, func(c *relay.Config) { c.Admin.Address = "127.0.0.1:0" })
	out := &syncBuffer{}
	stop := runAsync(t, out, "watch", "--server", r.Addr(), "--node-id", "envoy-1", "--cluster", "envoy-gateway-system/eg",
		"--user-agent", "envoy/1.31.2", "--client-feature", "envoy.lb.does_not_support_overprovisioning",
		"--client-feature", "envoy.lrs.supports_send_all_clusters", "--type", "lds")
	defer stop()
	waitForOutput(t, out, "name: edge")
	key := "cluster=envoy-gateway-system/eg,user_agent=envoy/1.31,client_features=envoy.lb.does_not_support_overprovisioning,envoy.lrs.supports_send_all_clusters"
	id := relay.GroupID(key)
	if !strings.Contains(id, "~") {
		t.Fatalf("the key is its own id %q: the test needs a longer one", id)
	}

	code, table, errOut := runCLI("groups", "--admin", r.AdminAddr())
	row := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(id) + `\s+1\s+default file://\S+ up\s+` + regexp.QuoteMeta(key) + `$`)
	if code != 0 || !strings.HasPrefix(table, "ID") || !row.MatchString(table) {
		t.Fatalf("groups: exit %d, %q %q; want a row for %s, 1 client, its upstream and key", code, table, errOut, id)
	}
	if code, js, _ := runCLI("groups", "--admin", r.AdminAddr(), "-o", "json"); code != 0 || !strings.Contains(js, `"id": "`+id+`"`) {
		t.Errorf("groups -o json: exit %d, %q", code, js)
	}
	code, sum, _ := runCLI("status", "--summary", "--admin", r.AdminAddr())
	if code != 0 || !regexp.MustCompile(`(?m)^`+regexp.QuoteMeta(id)+`\s+LDS\s`).MatchString(sum) {
		t.Errorf("status --summary: exit %d, %q; want the group as %s", code, sum, id)
	}
	code, waited, _ := runCLI("wait", "--admin", r.AdminAddr(), "--type", "lds", "--version", "nosuch", "--timeout", "300ms")
	if code != 1 || !strings.Contains(waited, `group "`+id+`"`) {
		t.Errorf("wait: exit %d, %q; want the group as %s", code, waited, id)
	}
}
