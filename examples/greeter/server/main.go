// Command server is the backend of the gRPC example: a gRPC server on the
// address examples/resources/greeter.yaml names (127.0.0.1:50051) that
// answers every call with its name. The example client reaches it through
// the relay's xDS (xds:///greeter).
package main

import (
	"context"
	"flag"
	"log"
	"net"

	"google.golang.org/grpc"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
)

// greeter answers with its name.
type greeter struct {
	testgrpc.UnimplementedTestServiceServer
	name string
}

func (g greeter) UnaryCall(context.Context, *testgrpc.SimpleRequest) (*testgrpc.SimpleResponse, error) {
	return &testgrpc.SimpleResponse{Hostname: g.name}, nil
}

func main() {
	addr := flag.String("addr", "127.0.0.1:50051", "where to listen")
	name := flag.String("name", "greeter-1", "the name every answer carries")
	flag.Parse()
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	s := grpc.NewServer()
	testgrpc.RegisterTestServiceServer(s, greeter{name: *name})
	log.Printf("greeter %s listening on %s", *name, ln.Addr())
	log.Fatal(s.Serve(ln))
}
