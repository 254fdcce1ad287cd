// Command client is the gRPC example's client: it dials xds:///greeter,
// which gRPC's xDS resolver resolves through the xDS server its bootstrap
// names (GRPC_XDS_BOOTSTRAP: examples/greeter/bootstrap.json, the relay on
// localhost:18001), and prints who answered.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	_ "google.golang.org/grpc/xds" // the xds:/// resolver
)

func main() {
	target := flag.String("target", "xds:///greeter", "the target to dial")
	wait := flag.Duration("wait", 30*time.Second, "how long to wait for an answer")
	flag.Parse()
	cc, err := grpc.NewClient(*target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), *wait)
	defer cancel()
	resp, err := testgrpc.NewTestServiceClient(cc).UnaryCall(ctx, &testgrpc.SimpleRequest{}, grpc.WaitForReady(true))
	if err != nil {
		log.Fatalf("%s: %v", *target, err)
	}
	fmt.Printf("%s answered by %s\n", *target, resp.GetHostname())
}
