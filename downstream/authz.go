package downstream

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"slices"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/xdsrelay/xdsrelay/cache"
	"github.com/xdsrelay/xdsrelay/internal/authz"
	"github.com/xdsrelay/xdsrelay/internal/xds"
)

// client is who makes a request, for the authorization check: the variant
// (for the metric), the client's TLS connection, nil without TLS, and its
// address.
type client struct {
	variant string
	tls     *tls.ConnectionState
	addr    string
}

// caller is c as the groups are told of it.
func (c client) caller() Caller {
	return Caller{Variant: c.variant, Identities: authz.Identities(c.tls), Addr: c.addr}
}

// streamVariants are the variants of xDS streams (services.go), whose
// series of xdsrelay_downstream_streams and of the time to a first response
// are there from the start.
var streamVariants = []string{"sotw-ads", "delta-ads", "sotw", "delta"}

// deniedVariants are the variants an authorization check counts a denial
// under: every stream variant, load reports included, and the polls.
var deniedVariants = append(slices.Clone(streamVariants), variantLRS, "fetch", "rest")

// grpcClient is the client of a gRPC stream or call.
func grpcClient(ctx context.Context, variant string) client {
	c := client{variant: variant}
	if p, ok := peer.FromContext(ctx); ok {
		if p.Addr != nil {
			c.addr = p.Addr.String()
		}
		if info, ok := p.AuthInfo.(credentials.TLSInfo); ok {
			c.tls = &info.State
		}
	}
	return c
}

// authorize checks the node a client claims against the identities of its
// certificate, before the client joins a group, so that a denied client
// never creates a group or reads a cache. Without rules, or without a node
// (which join refuses), there is nothing to check.
//
// It returns what the client may ask for (nil: anything).
func (s *Server) authorize(c client, node *corepb.Node) (*authz.Grant, error) {
	if s.authz == nil || node == nil {
		return nil, nil
	}
	g, err := s.authz.Grant(authz.Identities(c.tls), node)
	var d *authz.Denied
	if !errors.As(err, &d) {
		return g, err
	}
	s.denied.With(c.variant, d.Reason).Inc()
	return nil, status.Error(codes.PermissionDenied, "xdsrelay: "+d.Error())
}

// refuse keeps, of names a client subscribes to, those its grant allows;
// each other one is noted with a PERMISSION_DENIED error, sent for it alone
// (gRFC A88), and is never asked of a control plane.
func (b *streamBase) refuse(names []string) []string {
	if b.grant == nil {
		return names
	}
	keep := names[:0:0]
	for _, n := range names {
		if b.grant.Allows(n) {
			keep = append(keep, n)
			continue
		}
		if b.refused == nil {
			b.refused = map[string]*cache.ResourceError{}
		}
		auth, _ := xds.Authority(n)
		b.refused[n] = xds.NewError(n, codes.PermissionDenied,
			fmt.Sprintf("downstream.authorization.rules do not let this client ask for the xdstp authority %q", auth))
	}
	return keep
}

// refusedError is l with the error of a name the client was refused.
func (b *streamBase) refusedError(l *cache.Lookup) {
	if e := b.refused[l.Name]; e != nil {
		l.Error = e
	}
}
