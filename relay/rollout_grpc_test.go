package relay

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	endpointpb "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"

	"github.com/xdsrelay/xdsrelay/downstream"
	"github.com/xdsrelay/xdsrelay/internal/testcp"
)

// A real gRPC client in a group with a NACK-gated rollout (rollout.canary
// 1) keeps sending its RPCs to the backend it has while the one canary, a
// scripted delta client ranked below it, NACKs a change of the endpoints;
// the next change, which the canary ACKs, supersedes the held one and
// takes the gRPC client to the new backend, never through the NACKed one.
func TestRolloutGRPCClientKeepsOldBackendWhileHeld(t *testing.T) {
	const (
		bake      = time.Second // the canary NACKs well within it, even under load
		nackError = "backend-2 is not for us"
	)
	cp := testcp.Start(t)
	b1, b2, b3 := startBackend(t, "backend-1"), startBackend(t, "backend-2"), startBackend(t, "backend-3")
	greeters := func(version, backend string) {
		t.Helper()
		cp.Set(t, "greeters", version,
			testcp.Listener("greeter", "greeter-route"), testcp.Route("greeter-route", "greeter-cluster"),
			testcp.Cluster("greeter-cluster"), testcp.Endpoints("greeter-cluster", backend))
	}
	greeters("1", b1)
	// The canary (a raw stream) and the gRPC client share a group: kinds
	// merged on purpose.
	r := startRelay(t, cp.Addr, func(c *Config) {
		c.Rollout.Canary, c.Rollout.Bake, c.Upstream.GroupBy = 1, bake, []string{"cluster"}
	})

	// The canary is the node ranked lowest (FNV-1a 64 of the id, as the
	// downstream ranks streams): below the gRPC client.
	rankOfID := downstream.Rank
	const grpcID = "greeter-grpc-client"
	canaryID := ""
	for i := 0; i < 1000 && canaryID == ""; i++ {
		if id := fmt.Sprintf("greeter-canary-%d", i); rankOfID(id) < rankOfID(grpcID) {
			canaryID = id
		}
	}
	if canaryID == "" {
		t.Fatalf("no canary id ranks below %q", grpcID)
	}

	// The canary subscribes to the CLA and answers each response: a NACK
	// if the CLA places an endpoint on backend-2, else an ACK. answer
	// returns the addresses it was sent and whether it NACKed them.
	canary := openDelta(t, r.Addr())
	canary.send(&discoverypb.DeltaDiscoveryRequest{Node: node(canaryID, "greeters"),
		TypeUrl: resourcev3.EndpointType, ResourceNamesSubscribe: []string{"greeter-cluster"}})
	answer := func() (addrs []string, nacked bool) {
		t.Helper()
		resp := canary.recv()
		if resp.GetTypeUrl() != resourcev3.EndpointType {
			t.Fatalf("canary got %s, want only CLAs", resp.GetTypeUrl())
		}
		for _, res := range resp.GetResources() {
			var cla endpointpb.ClusterLoadAssignment
			if err := res.GetResource().UnmarshalTo(&cla); err != nil {
				t.Fatal(err)
			}
			for _, loc := range cla.GetEndpoints() {
				for _, lb := range loc.GetLbEndpoints() {
					sa := lb.GetEndpoint().GetAddress().GetSocketAddress()
					addrs = append(addrs, net.JoinHostPort(sa.GetAddress(), strconv.Itoa(int(sa.GetPortValue()))))
				}
			}
		}
		req := &discoverypb.DeltaDiscoveryRequest{TypeUrl: resp.GetTypeUrl(), ResponseNonce: resp.GetNonce()}
		if slices.Contains(addrs, b2) {
			req.ErrorDetail = &rpcstatus.Status{Code: int32(codes.InvalidArgument), Message: nackError}
			nacked = true
		}
		canary.send(req)
		return addrs, nacked
	}
	if addrs, nacked := answer(); !slices.Equal(addrs, []string{b1}) || nacked {
		t.Fatalf("canary's first CLA: %v (nacked %v), want [%s] acked", addrs, nacked, b1)
	}

	// The gRPC client, ranked above the canary, in the same group.
	cc := grpcXDSClient(t, r.Addr(), grpcID, "greeters", "xds:///greeter")
	client := testgrpc.NewTestServiceClient(cc)

	// call makes one RPC: no RPC of this test may ever reach backend-2.
	call := func() (string, error) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		resp, err := client.UnaryCall(ctx, &testgrpc.SimpleRequest{}, grpc.WaitForReady(true))
		if got := resp.GetHostname(); got == "backend-2" {
			t.Fatal("an RPC reached backend-2, whose endpoints the canary NACKed")
		}
		return resp.GetHostname(), err
	}
	callUntil := func(want string) {
		t.Helper()
		deadline := time.Now().Add(wait)
		var last string
		var lastErr error
		for time.Now().Before(deadline) {
			if last, lastErr = call(); lastErr == nil && last == want {
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
		t.Fatalf("RPCs never reached %s (last reached %q, error %v)", want, last, lastErr)
	}
	callUntil("backend-1")

	// The change to backend-2 goes to the canary only, which NACKs it: it
	// is held, counted, and shown with who NACKed it and why.
	greeters("2", b2)
	if addrs, nacked := answer(); !slices.Equal(addrs, []string{b2}) || !nacked {
		t.Fatalf("canary's second CLA: %v (nacked %v), want [%s] nacked", addrs, nacked, b2)
	}
	eventually(t, "the halt to be counted", func() bool {
		return strings.Contains(getMetrics(t, r), `xdsrelay_rollout_halts_total{type="ClusterLoadAssignment"} 1`)
	})
	var groups []debugGroup
	getJSON(t, r, "/debug/groups", &groups)
	if len(groups) != 1 || len(groups[0].Rollouts) != 1 {
		t.Fatalf("/debug/groups: %+v, want one group with one rollout", groups)
	}
	if ro := groups[0].Rollouts[0]; !ro.Held || ro.Canary != canaryID || ro.Error != nackError ||
		!slices.Equal(ro.Types, []string{resourcev3.EndpointType}) || ro.Canaries != 1 || ro.Acked != 0 {
		t.Fatalf("/debug/groups rollout: %+v, want held, NACKed by %s with %q", ro, canaryID, nackError)
	}

	// For three times the bake, every RPC still reaches backend-1.
	calls := 0
	for end := time.Now().Add(3 * bake); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		got, err := call()
		if err != nil || got != "backend-1" {
			t.Fatalf("while the change is held, an RPC reached %q (error %v), want backend-1", got, err)
		}
		calls++
	}
	if calls < 5 {
		t.Fatalf("only %d RPCs in the hold window", calls)
	}
	canary.quiet(50 * time.Millisecond) // nothing more was sent to the canary

	// The change to backend-3 supersedes the held one: the canary ACKs it
	// and the gRPC client follows it.
	greeters("3", b3)
	if addrs, nacked := answer(); !slices.Equal(addrs, []string{b3}) || nacked {
		t.Fatalf("canary's third CLA: %v (nacked %v), want [%s] acked", addrs, nacked, b3)
	}
	callUntil("backend-3")
	eventually(t, "no rollout waiting on /debug/groups", func() bool {
		getJSON(t, r, "/debug/groups", &groups)
		return len(groups) == 1 && len(groups[0].Rollouts) == 0
	})
	if m := getMetrics(t, r); !strings.Contains(m, `xdsrelay_rollout_halts_total{type="ClusterLoadAssignment"} 1`) {
		t.Fatalf("halts after the superseding change:\n%s", m)
	}
	for range 5 {
		if got, err := call(); err != nil || got != "backend-3" {
			t.Fatalf("after the release, an RPC reached %q (error %v), want backend-3", got, err)
		}
	}
}
