package relay

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"

	"github.com/xdsrelay/xdsrelay/internal/creds"
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
func dialUpstream(cfg Config, tc credentials.TransportCredentials) (*grpc.ClientConn, error) {
	if tc == nil {
		tc = insecure.NewCredentials()
	}
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(tc),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(cfg.Upstream.MaxMessageBytes)),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{
			Time: cfg.Upstream.KeepaliveTime, Timeout: cfg.Upstream.KeepaliveTimeout, PermitWithoutStream: true,
		}),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: reconnectBackoff(cfg), MinConnectTimeout: 5 * time.Second}),
	}
	if cfg.Tracing {
		opts = append(opts, grpc.WithStatsHandler(otelgrpc.NewClientHandler()))
	}
	if len(cfg.Upstream.Headers) > 0 {
		opts = append(opts, grpc.WithPerRPCCredentials(creds.Headers(cfg.Upstream.Headers)))
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

// upstreamTLS loads the upstream TLS material, nil when TLS is off.
func upstreamTLS(ctx context.Context, cfg Config, logger *slog.Logger) (*creds.Reloader, error) {
	if !cfg.Upstream.TLSEnabled && !cfg.Upstream.TLS.Enabled() {
		return nil, nil
	}
	if cfg.Upstream.TLS.Insecure {
		logger.Warn("upstream.tls.insecure_skip_verify: the control plane's certificate is NOT verified")
	}
	rl, err := creds.NewReloader(ctx, cfg.Upstream.TLS, logger)
	if err != nil {
		return nil, fmt.Errorf("upstream.tls: %w", err)
	}
	return rl, nil
}

// downstreamTLS loads the downstream TLS material, nil when TLS is off.
func downstreamTLS(ctx context.Context, cfg Config, logger *slog.Logger) (*creds.Reloader, error) {
	if !cfg.Downstream.TLS.Enabled() {
		return nil, nil
	}
	rl, err := creds.NewReloader(ctx, cfg.Downstream.TLS, logger)
	if err != nil {
		return nil, fmt.Errorf("downstream.tls: %w", err)
	}
	return rl, nil
}
