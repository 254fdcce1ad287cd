package downstream

import (
	"context"
	"crypto/tls"
	"errors"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/xdsrelay/xdsrelay/internal/authz"
)

// client is who makes a request, for the authorization check: the variant
// (for the metric) and the client's TLS connection, nil without TLS.
type client struct {
	variant string
	tls     *tls.ConnectionState
}

// grpcClient is the client of a gRPC stream or call.
func grpcClient(ctx context.Context, variant string) client {
	c := client{variant: variant}
	if p, ok := peer.FromContext(ctx); ok {
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
func (s *Server) authorize(c client, node *corepb.Node) error {
	if s.authz == nil || node == nil {
		return nil
	}
	err := s.authz.Check(authz.Identities(c.tls), node)
	var d *authz.Denied
	if !errors.As(err, &d) {
		return err
	}
	s.denied.With(c.variant, d.Reason).Inc()
	return status.Error(codes.PermissionDenied, "xdsrelay: "+d.Error())
}
