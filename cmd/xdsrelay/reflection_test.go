package main

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	statuspb "github.com/envoyproxy/go-control-plane/envoy/service/status/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
)

// grpcurlCall is a grpcurl command line: -plaintext -d DATA ADDR METHOD.
type grpcurlCall struct {
	plaintext    bool
	data         string
	addr, method string
}

// parseGrpcurl reads a grpcurl command as a shell would (shellWords).
func parseGrpcurl(t *testing.T, cmd string) grpcurlCall {
	t.Helper()
	words := shellWords(t, cmd)
	if len(words) == 0 || words[0] != "grpcurl" {
		t.Fatalf("not a grpcurl command: %q", words)
	}
	var c grpcurlCall
	var rest []string
	for i := 1; i < len(words); i++ {
		switch words[i] {
		case "-plaintext":
			c.plaintext = true
		case "-d":
			i++
			c.data = words[i]
		default:
			rest = append(rest, words[i])
		}
	}
	if len(rest) != 2 {
		t.Fatalf("grpcurl: want ADDR METHOD, got %q", rest)
	}
	c.addr, c.method = rest[0], rest[1]
	return c
}

// reflectFiles asks the server's reflection service for the file that
// defines symbol and every file it imports, as grpcurl does.
func reflectFiles(ctx context.Context, cc *grpc.ClientConn, symbol string) (*protoregistry.Files, []string, error) {
	st, err := reflectionpb.NewServerReflectionClient(cc).ServerReflectionInfo(ctx)
	if err != nil {
		return nil, nil, err
	}
	defer st.CloseSend()
	if err := st.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		return nil, nil, err
	}
	resp, err := st.Recv()
	if err != nil {
		return nil, nil, err
	}
	var services []string
	for _, s := range resp.GetListServicesResponse().GetService() {
		services = append(services, s.GetName())
	}
	if err := st.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_FileContainingSymbol{FileContainingSymbol: symbol}}); err != nil {
		return nil, nil, err
	}
	if resp, err = st.Recv(); err != nil {
		return nil, nil, err
	}
	if e := resp.GetErrorResponse(); e != nil {
		return nil, nil, fmt.Errorf("reflection: %s", e.GetErrorMessage())
	}
	set := &descriptorpb.FileDescriptorSet{}
	for _, b := range resp.GetFileDescriptorResponse().GetFileDescriptorProto() {
		fd := &descriptorpb.FileDescriptorProto{}
		if err := proto.Unmarshal(b, fd); err != nil {
			return nil, nil, err
		}
		set.File = append(set.File, fd)
	}
	files, err := protodesc.NewFiles(set)
	if err != nil {
		return nil, nil, fmt.Errorf("the reflected files: %w", err)
	}
	return files, services, nil
}

// The README's CSDS example, which docs/operations.md repeats, runs as
// written, but for the relay's host: its port is downstream.address's, and
// a client that, like grpcurl, knows the service only from the relay's gRPC
// reflection gets the status of the clients it asks for.
func TestReadmeGrpcurlCSDS(t *testing.T) {
	call := parseGrpcurl(t, docBlock(t, "README.md", "sh", "ClientStatusDiscoveryService/FetchClientStatus"))
	if again := parseGrpcurl(t, docBlock(t, "docs/operations.md", "sh", "ClientStatusDiscoveryService/FetchClientStatus")); again != call {
		t.Fatalf("docs/operations.md's grpcurl %+v is not the README's %+v, which this test runs", again, call)
	}
	r := bootReadme(t, func(_, content string) string { return content })
	opts, _, err := loadConfig(repo+"/config.example.yaml", nil)
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(opts.Relay.Downstream.Address)
	if _, got, _ := net.SplitHostPort(call.addr); got != port || !call.plaintext {
		t.Fatalf("the README's grpcurl dials %s (plaintext %v), downstream.address is %s", call.addr, call.plaintext, opts.Relay.Downstream.Address)
	}
	for _, id := range []string{"ingress-1", "egress-1"} {
		adsClient(t, r.Addr(), id)
	}

	cc, err := grpc.NewClient(r.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	service, method, _ := strings.Cut(call.method, "/")
	files, services, err := reflectFiles(ctx, cc, service)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(services, service) {
		t.Fatalf("reflection lists %v, not %s", services, service)
	}
	d, err := files.FindDescriptorByName(protoreflect.FullName(service))
	if err != nil {
		t.Fatal(err)
	}
	md := d.(protoreflect.ServiceDescriptor).Methods().ByName(protoreflect.Name(method))
	if md == nil {
		t.Fatalf("%s has no method %s", service, method)
	}
	in, out := dynamicpb.NewMessage(md.Input()), dynamicpb.NewMessage(md.Output())
	if err := protojson.Unmarshal([]byte(call.data), in); err != nil {
		t.Fatalf("the README's -d: %v", err)
	}
	if err := cc.Invoke(ctx, "/"+call.method, in, out); err != nil {
		t.Fatalf("%s: %v", call.method, err)
	}
	b, err := proto.Marshal(out)
	if err != nil {
		t.Fatal(err)
	}
	var resp statuspb.ClientStatusResponse
	if err := proto.Unmarshal(b, &resp); err != nil {
		t.Fatal(err)
	}
	var nodes []string
	for _, c := range resp.GetConfig() {
		nodes = append(nodes, c.GetNode().GetId())
	}
	if !slices.Equal(nodes, []string{"ingress-1"}) {
		t.Errorf("%s answered nodes %v, want [ingress-1]", call.method, nodes)
	}
}

// adsClient is a node subscribed to every cluster on a delta-ADS stream,
// once it has its first response; closed when the test ends.
func adsClient(t *testing.T, addr, id string) {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); cc.Close() })
	st, err := discoverypb.NewAggregatedDiscoveryServiceClient(cc).DeltaAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&discoverypb.DeltaDiscoveryRequest{Node: &corepb.Node{Id: id, Cluster: "example"}, TypeUrl: resourcev3.ClusterType}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); err != nil {
		t.Fatal(err)
	}
}
