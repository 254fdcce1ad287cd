package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/xdsrelay/xdsrelay/relay"
)

func clusterFile(name string) string {
	return `"@type": type.googleapis.com/envoy.config.cluster.v3.Cluster
name: ` + name + `
connect_timeout: 1s
type: STATIC
`
}

// Files removed from a file:// source are guarded as a control plane's
// removals are, and `xdsrelay guard release` lets them through.
func TestGuardReleaseCommand(t *testing.T) {
	dir := t.TempDir()
	for i := range 12 {
		writeFile(t, filepath.Join(dir, fmt.Sprintf("c%02d.yaml", i)), clusterFile(fmt.Sprintf("c%02d", i)))
	}
	r := startFileRelay(t, dir, func(c *relay.Config) { c.Admin.Address = "127.0.0.1:0" })

	conn, err := grpc.NewClient(r.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), cliWait)
	defer cancel()
	st, err := discoverypb.NewAggregatedDiscoveryServiceClient(conn).DeltaAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&discoverypb.DeltaDiscoveryRequest{Node: &corepb.Node{Id: "n", Cluster: "c1"}, TypeUrl: resourcev3.ClusterType}); err != nil {
		t.Fatal(err)
	}
	resps := make(chan *discoverypb.DeltaDiscoveryResponse, 16)
	go func() {
		defer close(resps)
		for {
			resp, err := st.Recv()
			if err != nil {
				return
			}
			resps <- resp
			if st.Send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: resp.GetTypeUrl(), ResponseNonce: resp.GetNonce()}) != nil {
				return
			}
		}
	}()
	if resp := <-resps; len(resp.GetResources()) != 12 {
		t.Fatalf("first response: %d clusters, want 12", len(resp.GetResources()))
	}
	for i := range 12 {
		os.Remove(filepath.Join(dir, fmt.Sprintf("c%02d.yaml", i)))
	}
	select {
	case resp := <-resps:
		t.Fatalf("a response reached the client while the removal should be held: %d removed", len(resp.GetRemovedResources()))
	case <-time.After(time.Second):
	}

	var out, errOut bytes.Buffer
	if c := run(context.Background(), []string{"guard", "list", "--admin", r.AdminAddr(), "--type", "clusters"}, nil, &out, &errOut); c != 0 ||
		!regexp.MustCompile(`(?m)^GROUP +TYPE +REMOVALS HELD +SINCE +WIPE\ncluster=c1,user_agent=,client_features= +CDS +12 +\S+Z +no\n$`).MatchString(out.String()) {
		t.Fatalf("guard list: exit %d: %q %s", c, out.String(), errOut.String())
	}
	out.Reset()
	if c := run(context.Background(), []string{"guard", "list", "--admin", r.AdminAddr(), "-o", "json"}, nil, &out, &errOut); c != 0 ||
		!strings.Contains(out.String(), `"names": 12`) {
		t.Fatalf("guard list -o json: exit %d: %q %s", c, out.String(), errOut.String())
	}
	out.Reset()
	if c := run(context.Background(), []string{"guard", "release", "--admin", r.AdminAddr(), "--type", "clusters"}, nil, &out, &errOut); c != 0 {
		t.Fatalf("exit %d: %s", c, errOut.String())
	}
	if !strings.Contains(out.String(), `released 12 removals of Cluster in group "cluster=c1,user_agent=,client_features="`) {
		t.Fatalf("output: %s", out.String())
	}
	select {
	case resp := <-resps:
		if len(resp.GetRemovedResources()) != 12 {
			t.Fatalf("after release: %d removed, want 12", len(resp.GetRemovedResources()))
		}
	case <-time.After(cliWait):
		t.Fatal("no removal after release")
	}
	cancel()
	for range resps {
	}
	out.Reset()
	if c := run(context.Background(), []string{"guard", "list", "--admin", r.AdminAddr()}, nil, &out, &errOut); c != 0 || out.String() != "nothing is held\n" {
		t.Fatalf("guard list after the release: exit %d: %q %s", c, out.String(), errOut.String())
	}

	if c := run(context.Background(), []string{"guard", "release", "--admin", r.AdminAddr(), "--group", "nope"}, nil, &out, &errOut); c != 1 ||
		!strings.Contains(errOut.String(), `no group "nope"`) {
		t.Fatalf("unknown group: exit %d: %s", c, errOut.String())
	}
	if c := run(context.Background(), []string{"guard", "release", "--admin", r.AdminAddr(), "--type", "bogus"}, nil, &out, &errOut); c != 2 {
		t.Fatalf("bad type: exit %d", c)
	}
}
