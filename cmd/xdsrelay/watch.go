package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/signal"
	"regexp"
	"strings"
	"syscall"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/spf13/cobra"
	"go.yaml.in/yaml/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/xdsrelay/xdsrelay/internal/xds"
)

// watchFlags are what watch subscribes to, as which client, and how it
// prints and answers.
type watchFlags struct {
	client    clientFlags
	nodeID    string
	cluster   string
	userAgent string
	features  []string
	typ       string
	delta     bool
	output    string
	nack      bool
	nackMatch string
}

// node is the node watch presents: with --user-agent and --client-feature
// it is grouped with the clients it stands in for.
func (wf *watchFlags) node() *corepb.Node {
	n := &corepb.Node{Id: wf.nodeID, Cluster: wf.cluster, ClientFeatures: wf.features}
	if wf.userAgent != "" {
		name, version := wf.userAgent, ""
		if i := strings.LastIndexByte(name, '/'); i > 0 {
			name, version = name[:i], name[i+1:]
		}
		n.UserAgentName = name
		n.UserAgentVersionType = &corepb.Node_UserAgentVersion{UserAgentVersion: version}
	}
	return n
}

func newWatchCmd() *cobra.Command {
	var wf watchFlags
	cmd := &cobra.Command{
		Use:   "watch --server ADDR --node-id ID [--cluster C] [--user-agent NAME/VERSION] [--client-feature F]... --type TYPE [NAME...] [--delta] [--nack | --nack-matching REGEX] [-o yaml|json]",
		Short: "Subscribe as a node and print resources as they change",
		Long: `Opens an ADS stream (state of the world, or incremental with --delta) as the
node --node-id in --cluster, subscribes to TYPE (any of its names, in any
case: cds, Cluster, clusters, or a type URL): the NAMEs given, or every
resource (wildcard) without names. Prints every response as protojson (or
YAML) and acknowledges it, until interrupted. --user-agent and
--client-feature present the node as the clients it stands in for, so that
the relay groups it with them. --nack rejects every response, and
--nack-matching REGEX those with a resource whose JSON matches REGEX (a
canary that NACKs a change); each NACK is reported on stderr. A stream the
server ends after it answered (a connection that aged out, a drain) is
opened again; any other end exits 1.`,
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
			judge, err := wf.judge()
			if err != nil {
				return usageError{cmd, err}
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			err = watch(ctx, &wf, typeURL, names, judge, cmd.OutOrStdout(), cmd.ErrOrStderr())
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
	fs.StringVar(&wf.userAgent, "user-agent", "", "the node's user agent `NAME/VERSION` (user_agent_name, user_agent_version), as the clients it stands in for send it: envoy/1.31.0, \"gRPC Go/1.70.0\"")
	fs.StringArrayVar(&wf.features, "client-feature", nil, "a client feature `F` of the node (repeatable), as the clients it stands in for send them")
	fs.BoolVar(&wf.nack, "nack", false, "reject (NACK) every response instead of acknowledging it")
	fs.StringVar(&wf.nackMatch, "nack-matching", "", "reject (NACK) a response with a resource whose compact JSON matches `REGEX`; acknowledge the others")
	fs.StringVar(&wf.typ, "type", "", "the resource `TYPE`: any of its names (cds, Cluster, clusters) or a type URL (required)")
	fs.BoolVar(&wf.delta, "delta", false, "use the incremental (delta) ADS protocol instead of state of the world")
	fs.StringVarP(&wf.output, "output", "o", "yaml", "`FORMAT`: yaml or json")
	return cmd
}

// watch subscribes and prints until ctx ends or the stream fails.
func watch(ctx context.Context, wf *watchFlags, typeURL string, names []string, judge judgeFunc, w, errW io.Writer) error {
	cc, done, err := wf.client.dial(ctx)
	if err != nil {
		return err
	}
	defer done()
	ads := discoverypb.NewAggregatedDiscoveryServiceClient(cc)
	node := wf.node()
	for {
		answered := false
		print := func(m proto.Message) error {
			answered = true
			return printDoc(w, m, wf.output)
		}
		if wf.delta {
			err = watchDelta(ctx, ads, node, typeURL, names, print, judge, errW)
		} else {
			err = watchSotW(ctx, ads, node, typeURL, names, print, judge, errW)
		}
		// A server that ends a connection that had answered (the relay's
		// downstream.max_connection_age, a drain) is subscribed to again on
		// a new stream, as xDS clients do; any other end is the command's.
		if ctx.Err() != nil || !answered || status.Code(errors.Unwrap(err)) != codes.Unavailable {
			if !answered && ctx.Err() == nil {
				if wrong := wf.client.explain(err); isWrongPort(wrong) {
					return wrong
				}
			}
			return err
		}
	}
}

// watchSotW subscribes on a state-of-the-world stream and ACKs each response
// with its version and nonce, or NACKs it with the version last ACKed and
// an error_detail ("ACK/NACK and resource type instance version").
func watchSotW(ctx context.Context, ads discoverypb.AggregatedDiscoveryServiceClient, node *corepb.Node, typeURL string, names []string,
	print func(proto.Message) error, judge judgeFunc, errW io.Writer) error {
	st, err := ads.StreamAggregatedResources(ctx)
	if err != nil {
		return fmt.Errorf("watch: %w", err)
	}
	acked := ""
	return ackLoop(st, &discoverypb.DiscoveryRequest{Node: node, TypeUrl: typeURL, ResourceNames: names}, print,
		func(resp *discoverypb.DiscoveryResponse) *discoverypb.DiscoveryRequest {
			req := &discoverypb.DiscoveryRequest{TypeUrl: typeURL, ResourceNames: names, VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()}
			if why := judge(resp.GetResources()); why != "" {
				req.VersionInfo, req.ErrorDetail = acked, nackStatus(why)
				fmt.Fprintf(errW, "watch: NACKed version %s (nonce %s): %s\n", resp.GetVersionInfo(), resp.GetNonce(), why)
				return req
			}
			acked = resp.GetVersionInfo()
			return req
		})
}

// watchDelta subscribes on an incremental stream and ACKs each response
// with its nonce, or NACKs it with an error_detail ("Incremental xDS").
func watchDelta(ctx context.Context, ads discoverypb.AggregatedDiscoveryServiceClient, node *corepb.Node, typeURL string, names []string,
	print func(proto.Message) error, judge judgeFunc, errW io.Writer) error {
	st, err := ads.DeltaAggregatedResources(ctx)
	if err != nil {
		return fmt.Errorf("watch: %w", err)
	}
	return ackLoop(st, &discoverypb.DeltaDiscoveryRequest{Node: node, TypeUrl: typeURL, ResourceNamesSubscribe: names}, print,
		func(resp *discoverypb.DeltaDiscoveryResponse) *discoverypb.DeltaDiscoveryRequest {
			req := &discoverypb.DeltaDiscoveryRequest{TypeUrl: typeURL, ResponseNonce: resp.GetNonce()}
			bodies := make([]*anypb.Any, 0, len(resp.GetResources()))
			for _, r := range resp.GetResources() {
				bodies = append(bodies, r.GetResource())
			}
			if why := judge(bodies); why != "" {
				req.ErrorDetail = nackStatus(why)
				fmt.Fprintf(errW, "watch: NACKed nonce %s: %s\n", resp.GetNonce(), why)
			}
			return req
		})
}

// judgeFunc says why watch rejects a response's resources, "" to accept
// them.
type judgeFunc func([]*anypb.Any) string

// judge is the verdict --nack and --nack-matching ask for.
func (wf *watchFlags) judge() (judgeFunc, error) {
	switch {
	case wf.nack && wf.nackMatch != "":
		return nil, errors.New("--nack and --nack-matching: give one")
	case wf.nack:
		return func([]*anypb.Any) string { return "--nack rejects every response" }, nil
	case wf.nackMatch == "":
		return func([]*anypb.Any) string { return "" }, nil
	}
	rx, err := regexp.Compile(wf.nackMatch)
	if err != nil {
		return nil, fmt.Errorf("--nack-matching: %w", err)
	}
	return func(resources []*anypb.Any) string {
		for _, a := range resources {
			if b, err := compactJSON(a); err == nil && rx.Match(b) {
				return fmt.Sprintf("--nack-matching %s matches %s", wf.nackMatch, xds.Clip(string(b)))
			}
		}
		return ""
	}, nil
}

// compactJSON is a resource as protojson without blanks: one layout for a
// REGEX to match, whatever protojson's own.
func compactJSON(a *anypb.Any) ([]byte, error) {
	b, err := xds.MarshalJSON(a)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	err = json.Compact(&buf, b)
	return buf.Bytes(), err
}

// nackStatus is a NACK's error_detail.
func nackStatus(why string) *rpcstatus.Status {
	return &rpcstatus.Status{Code: int32(codes.InvalidArgument), Message: "xdsrelay watch: " + why}
}

// ackLoop sends req, prints each response and answers it with ack's
// request, until the stream or print fails.
func ackLoop[Req, Resp any, PResp interface {
	*Resp
	proto.Message
}](st grpc.BidiStreamingClient[Req, Resp], req *Req, print func(proto.Message) error, ack func(*Resp) *Req) error {
	for {
		if err := st.Send(req); err != nil {
			if errors.Is(err, io.EOF) {
				// The stream has ended (a shed, a drain): Recv says how,
				// with the status the caller judges.
				return fmt.Errorf("watch: %w", recvEnd(st))
			}
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

// recvEnd is why a stream ended whose Send found it ended: the error Recv
// returns past the responses left.
func recvEnd[Resp any](st interface{ Recv() (*Resp, error) }) error {
	for {
		if _, err := st.Recv(); err != nil {
			return err
		}
	}
}

// printDoc writes m as a JSON document, or as a YAML document (after ---)
// converted from the same JSON, keeping its field order.
func printDoc(w io.Writer, m proto.Message, format string) error {
	if format == "json" {
		return printJSON(w, m)
	}
	b, err := xds.MarshalJSON(m)
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
