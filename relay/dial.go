package relay

import (
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
)

// reconnectBackoff is the upstream reconnect backoff: gRPC's defaults for
// the shape, the configuration for the bounds.
func reconnectBackoff(cfg Config) backoff.Config {
	b := backoff.DefaultConfig
	b.BaseDelay, b.MaxDelay = cfg.Upstream.ReconnectBaseDelay, cfg.Upstream.ReconnectMaxDelay
	return b
}

// dialUpstream prepares the connection to the control plane. With several
// addresses (upstream.address and upstream.addresses) gRPC's pick_first
// policy connects to the first that answers and moves to the next when it
// fails; a DNS name with several A records fails over the same way.
func dialUpstream(cfg Config) (*grpc.ClientConn, error) {
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(cfg.Upstream.MaxMessageBytes)),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{
			Time: cfg.Upstream.KeepaliveTime, Timeout: cfg.Upstream.KeepaliveTimeout, PermitWithoutStream: true,
		}),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: reconnectBackoff(cfg), MinConnectTimeout: 5 * time.Second}),
	}
	target := cfg.Upstream.Address
	if len(cfg.Upstream.Addresses) > 0 {
		addrs := []resolver.Address{{Addr: cfg.Upstream.Address}}
		for _, a := range cfg.Upstream.Addresses {
			addrs = append(addrs, resolver.Address{Addr: a})
		}
		res := manual.NewBuilderWithScheme("xdsrelay-upstream")
		res.InitialState(resolver.State{Addresses: addrs})
		opts = append(opts, grpc.WithResolvers(res))
		target = res.Scheme() + ":///control-plane"
	}
	conn, err := grpc.NewClient(target, opts...)
	if err != nil {
		return nil, fmt.Errorf("upstream.address: %w", err)
	}
	return conn, nil
}
