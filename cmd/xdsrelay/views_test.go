package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/xdsrelay/xdsrelay/relay"
)

// `xdsrelay config-dump --admin ADDR --node ID` prints what the client of
// that node holds, as the admin endpoint's config dump: its group and, in
// Envoy's /config_dump form, the cluster it ACKed. A node that is not
// connected exits 1 saying so; a missing --node is a usage error.
func TestConfigDumpCommand(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "c0.yaml"), clusterFile("c0"))
	r := startFileRelay(t, dir, func(c *relay.Config) { c.Admin.Address = "127.0.0.1:0" })
	st := sotwADS(t, r.Addr(), cliWait)
	if err := st.Send(&discoverypb.DiscoveryRequest{Node: &corepb.Node{Id: "proxy-1", Cluster: "c1"}, TypeUrl: resourcev3.ClusterType}); err != nil {
		t.Fatal(err)
	}
	resp, err := st.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&discoverypb.DiscoveryRequest{TypeUrl: resourcev3.ClusterType, VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()}); err != nil {
		t.Fatal(err)
	}
	var dump relay.DebugConfigDump
	eventually(t, func() string {
		code, out, errOut := runCLI("config-dump", "--admin", r.AdminAddr(), "--node", "proxy-1", "--type", "cds")
		if code != 0 {
			return fmt.Sprintf("config-dump: exit %d: %s", code, errOut)
		}
		if err := json.Unmarshal([]byte(out), &dump); err != nil || len(dump.Streams) != 1 {
			return fmt.Sprintf("config-dump printed %v: %s", err, out)
		}
		var compact bytes.Buffer
		if err := json.Compact(&compact, dump.Streams[0].ConfigDump); err != nil {
			return err.Error()
		}
		if s := compact.String(); !strings.Contains(s, `"@type":"type.googleapis.com/envoy.admin.v3.ClustersConfigDump"`) ||
			!strings.Contains(s, `"name":"c0"`) || !strings.Contains(s, `"client_status":"ACKED"`) {
			return "the config dump does not show c0 ACKED: " + s
		}
		return ""
	})
	if dump.Node != "proxy-1" || dump.Streams[0].Group != "cluster=c1,user_agent=,client_features=" || dump.Streams[0].Variant != "sotw-ads" {
		t.Errorf("config-dump: %+v", dump)
	}
	if code, _, errOut := runCLI("config-dump", "--admin", r.AdminAddr(), "--node", "nobody"); code != 1 || !strings.Contains(errOut, `no client with node id "nobody"`) {
		t.Errorf("an unknown node: exit %d: %s", code, errOut)
	}
	if code, _, errOut := runCLI("config-dump", "--admin", r.AdminAddr()); code != 2 || !strings.Contains(errOut, "--node is required") {
		t.Errorf("without --node: exit %d: %s", code, errOut)
	}
}
