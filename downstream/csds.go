package downstream

import (
	"context"
	"errors"
	"io"
	"strings"

	adminpb "github.com/envoyproxy/go-control-plane/envoy/admin/v3"
	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	statuspb "github.com/envoyproxy/go-control-plane/envoy/service/status/v3"
	matcherpb "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/xdsrelay/xdsrelay/internal/authz"
)

// csds serves the Client Status Discovery Service from the streams' status
// records: for each live xDS stream, what its client holds of each
// resource.
type csds struct {
	statuspb.UnimplementedClientStatusDiscoveryServiceServer
	srv *Server
}

// registerCSDS registers the CSDS service on g.
func (s *Server) registerCSDS(g *grpc.Server) {
	statuspb.RegisterClientStatusDiscoveryServiceServer(g, &csds{srv: s})
}

// FetchClientStatus answers one request.
func (c *csds) FetchClientStatus(ctx context.Context, req *statuspb.ClientStatusRequest) (*statuspb.ClientStatusResponse, error) {
	return c.srv.clientStatus(ctx, req)
}

// StreamClientStatus answers each request on the stream.
func (c *csds) StreamClientStatus(st grpc.BidiStreamingServer[statuspb.ClientStatusRequest, statuspb.ClientStatusResponse]) error {
	for {
		req, err := st.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		resp, err := c.srv.clientStatus(st.Context(), req)
		if err != nil {
			return err
		}
		if err := st.Send(resp); err != nil {
			return err
		}
	}
}

// clientStatus builds the answer to req: one ClientConfig per node id, with
// every stream of that node. With authorization rules, a caller sees only
// the nodes its certificate may claim (docs/architecture.md, invariant 8
// "Identity decides the tenant").
func (s *Server) clientStatus(ctx context.Context, req *statuspb.ClientStatusRequest) (*statuspb.ClientStatusResponse, error) {
	keep, err := nodeFilter(req.GetNodeMatchers())
	if err != nil {
		return nil, err
	}
	if s.authz != nil {
		ids, match := authz.Identities(grpcClient(ctx, "csds").tls), keep
		keep = func(n *corepb.Node) bool {
			return (match == nil || match(n)) && s.authz.Check(ids, n) == nil
		}
	}
	resp := &statuspb.ClientStatusResponse{}
	byID := map[string]*statuspb.ClientConfig{}
	for _, c := range s.Clients(keep) {
		cc := byID[c.Node.GetId()]
		if cc == nil {
			cc = &statuspb.ClientConfig{Node: c.Node}
			byID[c.Node.GetId()] = cc
			resp.Config = append(resp.Config, cc)
		}
		for _, t := range c.Types {
			for _, r := range t.Resources {
				cc.GenericXdsConfigs = append(cc.GenericXdsConfigs, genericConfig(t.TypeURL, r))
			}
		}
	}
	return resp, nil
}

func genericConfig(typeURL string, r ResourceStatus) *statuspb.ClientConfig_GenericXdsConfig {
	g := &statuspb.ClientConfig_GenericXdsConfig{TypeUrl: typeURL, Name: r.Name, VersionInfo: r.Version}
	if !r.Sent.IsZero() {
		g.LastUpdated = timestamppb.New(r.Sent)
	}
	switch r.State {
	case Requested:
		g.ClientStatus, g.ConfigStatus = adminpb.ClientResourceStatus_REQUESTED, statuspb.ConfigStatus_NOT_SENT
		if r.Version != "" {
			g.ConfigStatus = statuspb.ConfigStatus_STALE // sent, not acknowledged yet
		}
	case Acked:
		g.ClientStatus, g.ConfigStatus = adminpb.ClientResourceStatus_ACKED, statuspb.ConfigStatus_SYNCED
	case Nacked:
		g.ClientStatus, g.ConfigStatus = adminpb.ClientResourceStatus_NACKED, statuspb.ConfigStatus_ERROR
		g.ErrorState = &adminpb.UpdateFailureState{Details: r.Error, VersionInfo: r.Version, LastUpdateAttempt: timestamppb.New(r.ErrorAt)}
	case DoesNotExist:
		g.ClientStatus, g.ConfigStatus = adminpb.ClientResourceStatus_DOES_NOT_EXIST, statuspb.ConfigStatus_SYNCED
	}
	return g
}

// nodeFilter turns node_matchers (OR of each) into a filter: node ids by
// exact, prefix, suffix or contains, with ignore_case. Regular expressions
// and metadata matchers are refused.
func nodeFilter(ms []*matcherpb.NodeMatcher) (func(*corepb.Node) bool, error) {
	if len(ms) == 0 {
		return nil, nil
	}
	var ids []*matcherpb.StringMatcher
	for _, m := range ms {
		if len(m.GetNodeMetadatas()) > 0 {
			return nil, status.Error(codes.InvalidArgument, "xdsrelay: node_matchers.node_metadatas is not supported (match on node_id)")
		}
		switch m.GetNodeId().GetMatchPattern().(type) {
		case *matcherpb.StringMatcher_Exact, *matcherpb.StringMatcher_Prefix, *matcherpb.StringMatcher_Suffix, *matcherpb.StringMatcher_Contains:
		case nil:
			return nil, status.Error(codes.InvalidArgument, "xdsrelay: node_matchers.node_id is required")
		default:
			return nil, status.Errorf(codes.InvalidArgument, "xdsrelay: node_matchers.node_id: only exact, prefix, suffix and contains are supported, not %T", m.GetNodeId().GetMatchPattern())
		}
		ids = append(ids, m.GetNodeId())
	}
	return func(n *corepb.Node) bool {
		for _, m := range ids {
			if matchString(m, n.GetId()) {
				return true
			}
		}
		return false
	}, nil
}

func matchString(m *matcherpb.StringMatcher, s string) bool {
	want := ""
	var f func(s, p string) bool
	switch p := m.GetMatchPattern().(type) {
	case *matcherpb.StringMatcher_Exact:
		want, f = p.Exact, func(s, p string) bool { return s == p }
	case *matcherpb.StringMatcher_Prefix:
		want, f = p.Prefix, strings.HasPrefix
	case *matcherpb.StringMatcher_Suffix:
		want, f = p.Suffix, strings.HasSuffix
	case *matcherpb.StringMatcher_Contains:
		want, f = p.Contains, strings.Contains
	default:
		return false
	}
	if m.GetIgnoreCase() {
		s, want = strings.ToLower(s), strings.ToLower(want)
	}
	return f(s, want)
}
