// Command client is the gRPC example's client: it dials xds:///greeter,
// which gRPC's xDS resolver resolves through the xDS server its bootstrap
// names (GRPC_XDS_BOOTSTRAP: examples/greeter/bootstrap.json, the relay on
// localhost:18001, or -xds-server instead), and prints who answered.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/xds" // the xds:/// resolver
)

func main() {
	target := flag.String("target", "xds:///greeter", "the target to dial")
	wait := flag.Duration("wait", 30*time.Second, "how long to wait for an answer")
	waitForReady := flag.Bool("wait-for-ready", true, "wait, up to -wait, for a channel that is not ready yet (gRPC's WaitForReady); false fails the call at once with the error the channel has, such as an xDS resource that does not exist")
	count := flag.Int("count", 1, "how many calls to make, -every apart (a client that stays, to watch its load reports)")
	every := flag.Duration("every", time.Second, "the time between calls, with -count")
	xdsServer := flag.String("xds-server", "", "use this `host:port` as the xDS server instead of the bootstrap's server_uri (a relay on another port)")
	flag.Parse()
	opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	if *xdsServer != "" {
		r, err := resolverFor(*xdsServer)
		if err != nil {
			log.Fatal(err)
		}
		opts = append(opts, grpc.WithResolvers(r))
	}
	cc, err := grpc.NewClient(*target, opts...)
	if err != nil {
		log.Fatal(err)
	}
	defer cc.Close()
	for i := range *count {
		if i > 0 {
			time.Sleep(*every)
		}
		if err := call(cc, *target, *wait, *waitForReady); err != nil {
			log.Fatal(err)
		}
	}
}

// call makes one call and prints who answered.
func call(cc *grpc.ClientConn, target string, wait time.Duration, waitForReady bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	resp, err := testgrpc.NewTestServiceClient(cc).UnaryCall(ctx, &testgrpc.SimpleRequest{}, grpc.WaitForReady(waitForReady))
	if err != nil {
		return fmt.Errorf("%s: %w", target, err)
	}
	fmt.Printf("%s answered by %s\n", target, resp.GetHostname())
	return nil
}

// resolverFor is an xds:/// resolver whose bootstrap is GRPC_XDS_BOOTSTRAP's
// with every server_uri set to server.
func resolverFor(server string) (resolver.Builder, error) {
	b, err := os.ReadFile(os.Getenv("GRPC_XDS_BOOTSTRAP"))
	if err != nil {
		return nil, fmt.Errorf("-xds-server: reading GRPC_XDS_BOOTSTRAP: %w", err)
	}
	var bootstrap map[string]any
	if err := json.Unmarshal(b, &bootstrap); err != nil {
		return nil, fmt.Errorf("-xds-server: GRPC_XDS_BOOTSTRAP: %w", err)
	}
	servers, _ := bootstrap["xds_servers"].([]any)
	if len(servers) == 0 {
		return nil, errors.New("-xds-server: GRPC_XDS_BOOTSTRAP names no xds_servers")
	}
	for _, s := range servers {
		if m, ok := s.(map[string]any); ok {
			m["server_uri"] = server
		}
	}
	if b, err = json.Marshal(bootstrap); err != nil {
		return nil, err
	}
	return xds.NewXDSResolverWithConfigForTesting(b)
}
