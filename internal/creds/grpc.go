package creds

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"strings"
	"sync/atomic"

	"google.golang.org/grpc/credentials"
)

// ServerCredentials returns ServerConfig as gRPC transport credentials.
func (r *Reloader) ServerCredentials() credentials.TransportCredentials {
	return credentials.NewTLS(r.ServerConfig())
}

// ClientCredentials returns gRPC transport credentials for the control plane:
// each connection verifies the server against the CA pool current when it
// is made, under ServerName or else the dialled authority (an IP address
// included), and presents the current client certificate, if any. Without
// one, a connection whose server asked for one says so in its errors,
// naming certKeys, the settings that give one ("upstream.tls.cert_file and
// key_file"): a server that requires it otherwise shows only "write:
// broken pipe" or "tls: certificate required".
func (r *Reloader) ClientCredentials(certKeys string) credentials.TransportCredentials {
	return &clientCreds{r: r, serverName: r.t.ServerName, certKeys: certKeys}
}

var _ credentials.TransportCredentials = (*clientCreds)(nil)

// clientCreds builds grpc's TLS credentials afresh for each handshake, from
// the material current at that moment.
type clientCreds struct {
	r          *Reloader
	serverName string // set before use, as grpc's own credentials require
	certKeys   string // the settings that give a client certificate
}

func (c *clientCreds) ClientHandshake(ctx context.Context, authority string, conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	cfg := c.r.handshakeConfig()
	var asked atomic.Bool
	if cfg.GetClientCertificate == nil {
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			asked.Store(true)
			return &tls.Certificate{}, nil // none: the server decides
		}
	}
	tc, info, err := credentials.NewTLS(cfg).ClientHandshake(ctx, authority, conn)
	if !asked.Load() {
		return tc, info, err
	}
	hint := fmt.Sprintf("the server asked for a client certificate and none is set (%s); it may require one", c.certKeys)
	if err != nil {
		return nil, nil, fmt.Errorf("%w (%s)", err, hint)
	}
	return &certAskedConn{Conn: tc, hint: hint}, info, nil
}

// certAskedConn is a connection whose server asked for a client
// certificate that was not given: its I/O errors say so. A server that
// requires one ends the connection after the handshake (TLS 1.3), so that
// the first write fails with "broken pipe" or the first read with "tls:
// certificate required", neither of which names the cause. io.EOF and a
// close of our own are passed as they are.
type certAskedConn struct {
	net.Conn
	hint string
}

func (c *certAskedConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	return n, c.explain(err)
}

func (c *certAskedConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	return n, c.explain(err)
}

func (c *certAskedConn) explain(err error) error {
	if err == nil || errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
		return err
	}
	return fmt.Errorf("%w (%s)", err, c.hint)
}

func (c *clientCreds) ServerHandshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return credentials.NewTLS(c.r.ServerConfig()).ServerHandshake(conn)
}

func (c *clientCreds) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "tls", SecurityVersion: "1.2", ServerName: c.serverName}
}

func (c *clientCreds) Clone() credentials.TransportCredentials {
	cp := *c
	return &cp
}

// OverrideServerName sets the authority gRPC uses, and so the name verified.
//
// Deprecated: use TLS.ServerName.
func (c *clientCreds) OverrideServerName(name string) error {
	c.serverName = name
	return nil
}

// Headers returns per-RPC credentials that send h as metadata on every RPC,
// such as {"authorization": "Bearer …"}. They do not require transport
// security.
func Headers(h map[string]string) credentials.PerRPCCredentials {
	md := make(headers, len(h))
	for k, v := range h {
		md[strings.ToLower(k)] = v
	}
	return md
}

type headers map[string]string

func (h headers) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return maps.Clone(h), nil
}

func (headers) RequireTransportSecurity() bool { return false }

// HeadersFromFile returns per-RPC credentials that send the header name with
// the content of the file at path (surrounding space trimmed), read afresh
// for every RPC so that a rotated token is picked up. The file is read once
// now to check it. They require transport security.
func HeadersFromFile(name, path string) (credentials.PerRPCCredentials, error) {
	if name == "" {
		return nil, errors.New("creds: a header read from a file needs a name")
	}
	f := fileHeader{name: strings.ToLower(name), path: path}
	if _, err := f.value(); err != nil {
		return nil, err
	}
	return f, nil
}

type fileHeader struct{ name, path string }

func (f fileHeader) value() (string, error) {
	b, err := os.ReadFile(f.path)
	if err != nil {
		return "", fmt.Errorf("creds: header %s: %w", f.name, err)
	}
	v := strings.TrimSpace(string(b))
	if v == "" {
		return "", fmt.Errorf("creds: header %s: %s is empty", f.name, f.path)
	}
	return v, nil
}

func (f fileHeader) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	v, err := f.value()
	if err != nil {
		return nil, err
	}
	return map[string]string{f.name: v}, nil
}

func (fileHeader) RequireTransportSecurity() bool { return true }
