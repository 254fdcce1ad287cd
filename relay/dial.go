package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"

	"github.com/xdsrelay/xdsrelay/internal/creds"
	"github.com/xdsrelay/xdsrelay/upstream"
)

// reconnectBackoff is the upstream reconnect backoff: gRPC's defaults for
// the shape, the configuration for the bounds.
func reconnectBackoff(u UpstreamConfig) backoff.Config {
	b := backoff.DefaultConfig
	b.BaseDelay, b.MaxDelay = u.ReconnectBaseDelay, u.ReconnectMaxDelay
	return b
}

// dialServer prepares the connection to one server of an upstream. Each
// server has its own connection: the client picks among them by gRFC A71's
// rules (upstream.Client), not gRPC's pick_first. Its HTTP/2 frames are
// watched (upstream.WatchFrames): the streams' liveness is their own, not
// only the connection's (docs/architecture.md, invariant 17). The
// connection's attempts are followed, so that each failed one is reported
// once.
func dialServer(u UpstreamConfig, addr string, tracing bool, tc credentials.TransportCredentials, extra ...grpc.DialOption) (upstream.Server, error) {
	if tc == nil {
		tc = insecure.NewCredentials()
	}
	tc, frames := upstream.WatchFrames(tc)
	attempts, counted := upstream.TrackAttempts()
	opts := []grpc.DialOption{
		counted,
		grpc.WithTransportCredentials(tc),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(u.MaxMessageBytes)),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{
			Time: u.KeepaliveTime, Timeout: u.KeepaliveTimeout, PermitWithoutStream: true,
		}),
		// A connection attempt gets connect_timeout (gRPC lets a later one
		// take as long as its backoff delay, when that is longer).
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: reconnectBackoff(u), MinConnectTimeout: u.ConnectTimeout}),
	}
	if tracing {
		opts = append(opts, grpc.WithStatsHandler(otelgrpc.NewClientHandler()))
	}
	if len(u.Headers) > 0 {
		opts = append(opts, grpc.WithPerRPCCredentials(creds.Headers(u.Headers)))
	}
	conn, err := grpc.NewClient(addr, append(opts, extra...)...)
	if err != nil {
		attempts.Release()
		return upstream.Server{}, fmt.Errorf("%s: %w", addr, err)
	}
	return upstream.Server{Name: addr, Conn: conn, Frames: frames, Attempts: attempts}, nil
}

// upstreamTLS loads an upstream's TLS material, nil when TLS is off.
func upstreamTLS(ctx context.Context, u UpstreamConfig, key string, logger *slog.Logger) (*creds.Reloader, error) {
	if !u.TLSEnabled && !u.TLS.Enabled() {
		return nil, nil
	}
	rl, err := creds.NewReloader(ctx, u.TLS, logger)
	if err != nil {
		return nil, tlsError(key, "ca_file", err)
	}
	return rl, nil
}

// tlsError names the key of a TLS setting that does not load: prefix.tls
// and, for a file, the file's key (caKey names the CA bundle's: ca_file
// upstream, client_ca_file for a server).
func tlsError(prefix, caKey string, err error) error {
	var fe *creds.FileError
	if !errors.As(err, &fe) {
		return fmt.Errorf("%s.tls: %w", prefix, err)
	}
	key := [...]string{creds.CertFile: "cert_file", creds.KeyFile: "key_file", creds.CAFile: caKey}[fe.File]
	return fmt.Errorf("%s.tls.%s: %w", prefix, key, err)
}

// downstreamTLS loads the downstream TLS material, nil when TLS is off.
func downstreamTLS(ctx context.Context, cfg Config, logger *slog.Logger) (*creds.Reloader, error) {
	if !cfg.Downstream.TLS.Enabled() {
		return nil, nil
	}
	rl, err := creds.NewReloader(ctx, cfg.Downstream.TLS, logger)
	if err != nil {
		return nil, tlsError("downstream", "client_ca_file", err)
	}
	return rl, nil
}
