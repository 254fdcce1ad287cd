package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc/status"

	"github.com/xdsrelay/xdsrelay/relay"
)

// One flag, one port: the commands that read the admin endpoint take
// --admin (admin.address, HTTP), those that speak xDS take --server
// (downstream.address, gRPC). Pointed at the other kind of port, a command
// says so at once, in words, instead of printing the other protocol's
// bytes or retrying until its timeout: an HTTP client that is answered in
// HTTP/2 frames (a gRPC server's SETTINGS), or by a gRPC response, is at
// an xDS port; a gRPC client that is answered "HTTP/1.1 ...", or by an
// HTTP response that is not gRPC's, is at the admin endpoint.

// wrongPort is a command pointed at the other kind of port. Asking again
// would be answered the same: wait stops at once.
type wrongPort struct {
	flag, addr, is, want string
}

func (e wrongPort) Error() string {
	return fmt.Sprintf("%s %s: %s, not %s", e.flag, e.addr, e.is, e.want)
}

// Where each kind of port is, for wrongPort's words.
const (
	isXDS     = "it answers in gRPC (HTTP/2), as the relay's xDS port does (downstream.address, :18001 by default)"
	isAdmin   = "it answers in HTTP/1.1, as the relay's admin endpoint does (admin.address, 127.0.0.1:9901 by default)"
	isREST    = "it answers as the relay's REST-JSON port does (downstream.rest_address)"
	isRESTRPC = "it answers in HTTP/1.1, as the relay's REST-JSON port does (downstream.rest_address)"
	wantAdm   = "the admin endpoint this command reads with --admin"
	wantXDS   = "the xDS port this command speaks gRPC to with --server (the admin endpoint is read with status --summary --admin, wait --admin, admin --admin)"
)

// sniffed keeps the first bytes a connection read, for each connection a
// client dials: what the server said first tells which kind of port it is.
// Its fields are atomic: gRPC dials and reads on goroutines of its own.
type sniffed struct {
	// http1 is set for an HTTP/1 client's connections: a first read in
	// HTTP/2 frames fails instead of reaching the client, which would
	// print it. Read-only once dialing starts.
	http1 bool

	first atomic.Pointer[[]byte] // of the latest connection that read anything
	// Of the latest TLS handshake: the protocol the server chose of those
	// offered (ALPN); nil before one is done.
	alpn atomic.Pointer[string]
}

// tls is cfg offering HTTP/1.1 in the handshake (ALPN) and recording, once
// the server is verified, what it chose.
func (s *sniffed) tls(cfg *tls.Config) *tls.Config {
	cfg.NextProtos = []string{"http/1.1"}
	verify := cfg.VerifyConnection
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		if verify != nil {
			if err := verify(cs); err != nil {
				return err
			}
		}
		proto := cs.NegotiatedProtocol
		s.alpn.Store(&proto)
		return nil
	}
	return cfg
}

// hungUp reports whether err is a TLS server hanging up on an HTTP/1.1
// request right after a handshake that chose no protocol of HTTP/1.1
// alone: a gRPC server does so, as it speaks h2 only (and it hangs up on a
// connection without h2).
func (s *sniffed) hungUp(err error) bool {
	alpn := s.alpn.Load()
	// net/http says a connection closed before any byte of the answer in
	// one of these, by when it notices: its "server closed idle
	// connection" (unexported) when the close comes before it reads.
	return alpn != nil && *alpn == "" && (errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) ||
		strings.Contains(err.Error(), "server closed idle connection"))
}

// sniffLen is how much of a connection's first read is kept: an HTTP/2
// frame header, or "HTTP/1.".
const sniffLen = 9

func (s *sniffed) record(b []byte) {
	first := bytes.Clone(b[:min(len(b), sniffLen)])
	s.first.Store(&first)
}

func (s *sniffed) bytes() []byte {
	if b := s.first.Load(); b != nil {
		return *b
	}
	return nil
}

// dial dials addr over TCP and keeps what the connection reads first.
func (s *sniffed) dial(ctx context.Context, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	return &sniffConn{Conn: c, s: s}, nil
}

// sniffConn records its first read in s.
type sniffConn struct {
	net.Conn
	s     *sniffed
	once  sync.Once
	http2 bool // the first read was HTTP/2 frames, on an HTTP/1 client's connection
}

// errHTTP2 ends an HTTP/1 client's connection that is answered in HTTP/2.
var errHTTP2 = errors.New("the server answers in HTTP/2 frames")

func (c *sniffConn) Read(b []byte) (int, error) {
	if c.http2 {
		return 0, errHTTP2
	}
	n, err := c.Conn.Read(b)
	if n > 0 {
		c.once.Do(func() {
			c.s.record(b[:n])
			c.http2 = c.s.http1 && http2Frame(b[:n])
		})
	}
	if c.http2 {
		// Not passed on: net/http would log them as an unsolicited
		// response, bytes and all.
		return 0, errHTTP2
	}
	return n, err
}

// http2Frame reports whether b starts as an HTTP/2 server does: a SETTINGS
// frame (type 4) on stream 0, its length a multiple of 6 (RFC 9113, 6.5).
func http2Frame(b []byte) bool {
	if len(b) < sniffLen {
		return false
	}
	length := int(b[0])<<16 | int(b[1])<<8 | int(b[2])
	return b[3] == 0x4 && length%6 == 0 && b[5]&0x7f == 0 && b[6] == 0 && b[7] == 0 && b[8] == 0
}

// http1Answer reports whether b starts as an HTTP/1.x response does.
func http1Answer(b []byte) bool { return bytes.HasPrefix(b, []byte("HTTP/1.")) }

// adminWrongPort is the error of an admin request that reached an xDS
// port, judged from the request's error and what its connections read
// (sniff), or from the answer's headers (either may be nil); nil if
// nothing says so.
func adminWrongPort(flag, addr string, err error, sniff *sniffed, h http.Header) error {
	switch {
	case err != nil && sniff != nil && (http2Frame(sniff.bytes()) || sniff.hungUp(err)),
		h != nil && (strings.HasPrefix(h.Get("Content-Type"), "application/grpc") || h.Get("Grpc-Status") != ""):
		return wrongPort{flag: flag, addr: addr, is: isXDS, want: wantAdm}
	case h != nil && h.Get(relay.RESTListenerHeader) == relay.RESTListener:
		return wrongPort{flag: flag, addr: addr, is: isREST, want: wantAdm}
	}
	return nil
}

// restPort reports whether the HTTP/1.1 server at addr is the relay's
// REST-JSON port: asked for a path it does not serve, it says so
// (relay.RESTListenerHeader), where the admin endpoint answers its index.
func restPort(ctx context.Context, addr string) bool {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/", nil)
	if err != nil {
		return false
	}
	tr := &http.Transport{Proxy: nil}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.Header.Get(relay.RESTListenerHeader) == relay.RESTListener
}

// xdsWrongPort is the error of a gRPC call that reached an HTTP/1 port
// (the admin endpoint), judged from the call's error and what the
// connection read first; err itself otherwise.
func xdsWrongPort(addr string, err error, first []byte) error {
	if err == nil {
		return nil
	}
	msg := status.Convert(err).Message()
	if http1Answer(first) || strings.Contains(msg, "unexpected content-type \"text/") || strings.Contains(msg, "http2: frame too large") {
		return wrongPort{flag: "--server", addr: addr, is: isAdmin, want: wantXDS}
	}
	return err
}

// isWrongPort reports whether err says a command reached the other kind of
// port.
func isWrongPort(err error) bool {
	var w wrongPort
	return errors.As(err, &w)
}
