package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os/signal"
	"syscall"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/spf13/cobra"
	"go.yaml.in/yaml/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// watchFlags are what watch subscribes to and how it prints.
type watchFlags struct {
	client  clientFlags
	nodeID  string
	cluster string
	typ     string
	delta   bool
	output  string
}

func newWatchCmd() *cobra.Command {
	var wf watchFlags
	cmd := &cobra.Command{
		Use:   "watch --server ADDR --node-id ID [--cluster C] --type TYPE [NAME...] [--delta] [-o yaml|json]",
		Short: "Subscribe as a node and print resources as they change",
		Long: `Opens an ADS stream (state of the world, or incremental with --delta) as the
node --node-id in --cluster, subscribes to TYPE (any of its names, in any
case: cds, Cluster, clusters, or a type URL): the NAMEs given, or every
resource (wildcard) without names. Prints every response as protojson (or
YAML) and acknowledges it, until interrupted. A stream the server ends
after it answered (a connection that aged out, a drain) is opened again;
any other end exits 1.`,
		RunE: func(cmd *cobra.Command, names []string) error {
			if err := required(cmd, "server", "node-id", "type"); err != nil {
				return err
			}
			typeURL, err := parseType(wf.typ)
			if err != nil {
				return usageError{cmd, err}
			}
			if wf.output != "yaml" && wf.output != "json" {
				return usageError{cmd, fmt.Errorf("-o: %q is not yaml or json", wf.output)}
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			err = watch(ctx, &wf, typeURL, names, cmd.OutOrStdout())
			if ctx.Err() != nil && (status.Code(err) == codes.Canceled || errors.Is(err, context.Canceled)) {
				return nil // interrupted: the normal end
			}
			return err
		},
	}
	wf.client.add(cmd)
	fs := cmd.Flags()
	fs.StringVar(&wf.nodeID, "node-id", "", "subscribe as the node with this `ID` (required)")
	fs.StringVar(&wf.cluster, "cluster", "", "the node's `CLUSTER`")
	fs.StringVar(&wf.typ, "type", "", "the resource `TYPE`: any of its names (cds, Cluster, clusters) or a type URL (required)")
	fs.BoolVar(&wf.delta, "delta", false, "use the incremental (delta) ADS protocol instead of state of the world")
	fs.StringVarP(&wf.output, "output", "o", "yaml", "`FORMAT`: yaml or json")
	return cmd
}

// watch subscribes and prints until ctx ends or the stream fails.
func watch(ctx context.Context, wf *watchFlags, typeURL string, names []string, w io.Writer) error {
	cc, done, err := wf.client.dial(ctx)
	if err != nil {
		return err
	}
	defer done()
	ads := discoverypb.NewAggregatedDiscoveryServiceClient(cc)
	node := &corepb.Node{Id: wf.nodeID, Cluster: wf.cluster}
	for {
		answered := false
		print := func(m proto.Message) error {
			answered = true
			return printDoc(w, m, wf.output)
		}
		if wf.delta {
			err = watchDelta(ctx, ads, node, typeURL, names, print)
		} else {
			err = watchSotW(ctx, ads, node, typeURL, names, print)
		}
		// A server that ends a connection that had answered (the relay's
		// downstream.max_connection_age, a drain) is subscribed to again on
		// a new stream, as xDS clients do; any other end is the command's.
		if ctx.Err() != nil || !answered || status.Code(errors.Unwrap(err)) != codes.Unavailable {
			return err
		}
	}
}

// watchSotW subscribes on a state-of-the-world stream and ACKs each response
// with its version and nonce ("ACK/NACK and resource type instance version").
func watchSotW(ctx context.Context, ads discoverypb.AggregatedDiscoveryServiceClient, node *corepb.Node, typeURL string, names []string, print func(proto.Message) error) error {
	st, err := ads.StreamAggregatedResources(ctx)
	if err != nil {
		return fmt.Errorf("watch: %w", err)
	}
	return ackLoop(st, &discoverypb.DiscoveryRequest{Node: node, TypeUrl: typeURL, ResourceNames: names}, print,
		func(resp *discoverypb.DiscoveryResponse) *discoverypb.DiscoveryRequest {
			return &discoverypb.DiscoveryRequest{TypeUrl: typeURL, ResourceNames: names, VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()}
		})
}

// watchDelta subscribes on an incremental stream and ACKs each response
// with its nonce ("Incremental xDS").
func watchDelta(ctx context.Context, ads discoverypb.AggregatedDiscoveryServiceClient, node *corepb.Node, typeURL string, names []string, print func(proto.Message) error) error {
	st, err := ads.DeltaAggregatedResources(ctx)
	if err != nil {
		return fmt.Errorf("watch: %w", err)
	}
	return ackLoop(st, &discoverypb.DeltaDiscoveryRequest{Node: node, TypeUrl: typeURL, ResourceNamesSubscribe: names}, print,
		func(resp *discoverypb.DeltaDiscoveryResponse) *discoverypb.DeltaDiscoveryRequest {
			return &discoverypb.DeltaDiscoveryRequest{TypeUrl: typeURL, ResponseNonce: resp.GetNonce()}
		})
}

// ackLoop sends req, prints each response and answers it with ack's
// request, until the stream or print fails.
func ackLoop[Req, Resp any, PResp interface {
	*Resp
	proto.Message
}](st grpc.BidiStreamingClient[Req, Resp], req *Req, print func(proto.Message) error, ack func(*Resp) *Req) error {
	for {
		if err := st.Send(req); err != nil {
			return fmt.Errorf("watch: send: %w", err)
		}
		resp, err := st.Recv()
		if err != nil {
			return fmt.Errorf("watch: %w", err)
		}
		if err := print(PResp(resp)); err != nil {
			return err
		}
		req = ack(resp)
	}
}

// printDoc writes m as a JSON document, or as a YAML document (after ---)
// converted from the same JSON, keeping its field order.
func printDoc(w io.Writer, m proto.Message, format string) error {
	if format == "json" {
		return printJSON(w, m)
	}
	b, err := protojson.Marshal(m)
	if err != nil {
		return err
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return err
	}
	blockStyle(&doc)
	out, err := yaml.Marshal(&doc)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "---\n%s", out)
	return err
}

// blockStyle drops JSON's flow style and quoting, for plain YAML.
func blockStyle(n *yaml.Node) {
	n.Style = 0
	for _, c := range n.Content {
		blockStyle(c)
	}
}
