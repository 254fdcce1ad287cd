package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"strings"

	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/xdsrelay/xdsrelay/internal/creds"
	"github.com/xdsrelay/xdsrelay/internal/xds"
)

// clientFlags are how the client commands (status, watch) reach a server.
type clientFlags struct {
	server string
	tls    bool
	files  creds.TLS
	sniff  sniffed // what the server said first (ports.go)
}

func (f *clientFlags) add(cmd *cobra.Command) {
	fs := cmd.Flags()
	fs.StringVar(&f.server, "server", "", "connect to `ADDR` (host:port), the relay's xDS port (downstream.address) or a control plane (required)")
	fs.BoolVar(&f.tls, "tls", false, "connect with TLS, verifying the server against the system roots (implied by the other TLS flags)")
	fs.StringVar(&f.files.CAFile, "ca-file", "", "verify the server against the CA bundle in `FILE` (implies --tls)")
	fs.StringVar(&f.files.CertFile, "cert-file", "", "present the client certificate in `FILE` (mTLS; with --key-file)")
	fs.StringVar(&f.files.KeyFile, "key-file", "", "the client certificate's private key `FILE`")
	fs.StringVar(&f.files.ServerName, "server-name", "", "verify the server certificate for `NAME` instead of the --server host")
}

// dial connects to the server; close releases the connection and the
// credentials' file watch.
func (f *clientFlags) dial(ctx context.Context) (cc *grpc.ClientConn, close func(), err error) {
	tc, done, err := f.credentials(ctx)
	if err != nil {
		return nil, nil, err
	}
	cc, err = grpc.NewClient(f.server, grpc.WithTransportCredentials(tc), grpc.WithContextDialer(f.sniff.dial))
	if err != nil {
		done()
		return nil, nil, fmt.Errorf("--server: %w", err)
	}
	return cc, func() { cc.Close(); done() }, nil
}

// explain turns the error of a call on the connection into a wrongPort
// when the server answered as the admin endpoint or the REST-JSON port
// does (ports.go).
func (f *clientFlags) explain(err error) error {
	err = xdsWrongPort(f.server, err, f.sniff.bytes())
	if w, ok := err.(wrongPort); ok && !f.tls && !f.files.Enabled() && restPort(context.Background(), f.server) {
		w.is = isRESTRPC
		return w
	}
	return err
}

// credentials are the transport credentials the flags ask for.
func (f *clientFlags) credentials(ctx context.Context) (credentials.TransportCredentials, func(), error) {
	switch {
	case f.files.Enabled():
		r, err := creds.NewReloader(ctx, f.files, slog.New(slog.DiscardHandler))
		if err != nil {
			return nil, nil, err
		}
		return r.ClientCredentials("--cert-file and --key-file"), r.Close, nil
	case f.tls:
		return credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS12}), func() {}, nil
	default:
		return insecure.NewCredentials(), func() {}, nil
	}
}

// parseType is the type URL that a --type names (xds.ParseType); a type
// URL the relay does not carry is taken as is, for a control plane's own.
func parseType(s string) (string, error) {
	t, err := xds.ParseType(s)
	if err != nil && strings.HasPrefix(s, resourcev3.APITypePrefix) {
		return s, nil
	}
	if err != nil {
		return "", fmt.Errorf("--type: %w", err)
	}
	return t, nil
}

// required refuses a command line without one of the named flags: exit 2.
func required(cmd *cobra.Command, names ...string) error {
	for _, n := range names {
		if !cmd.Flags().Changed(n) {
			return usageError{cmd, fmt.Errorf("--%s is required", n)}
		}
	}
	return nil
}
