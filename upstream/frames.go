package upstream

import (
	"context"
	"encoding/binary"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc/credentials"

	"github.com/xdsrelay/xdsrelay/internal/lockorder"
)

// Liveness is the stream's (docs/architecture.md, invariant 17). A ping or
// a health check answered shows the connection alive, and a load balancer
// between the relay and the control plane answers both for it while one
// stream behind it has stopped half-way through a response. gRPC shows no
// message until it is whole, so the relay reads the HTTP/2 frames of each
// control-plane connection as they pass (Frames): which responses have
// begun to arrive and not yet completed, and since when each has made no
// progress. A session judges no name missing while a response is partly
// read on its connection, and ends its stream as stalled when one has
// stopped for upstream.stall_timeout (stall.go).

// Frames watches the HTTP/2 frames of one server's connections: the
// gRPC messages partly received on them. WatchFrames makes one; nil
// watches nothing. Safe for concurrent use.
type Frames struct {
	mu      lockorder.Mutex[framesMu]
	partial map[*h2stream]struct{} // guarded by mu: messages begun, not complete
}

// h2stream is one HTTP/2 stream the relay opened on a watched connection,
// guarded by Frames.mu: where its gRPC framing (a 5-byte prefix with the
// message's length, then the message) stands.
type h2stream struct {
	prefix   [5]byte
	got      int    // bytes of the prefix read; 0 at a message boundary
	left     uint32 // bytes of the message still to come, once the prefix is read
	began    time.Time
	progress time.Time // of the message's last byte received
}

// WatchFrames wraps tc (insecure.NewCredentials() for plaintext) so that
// the connections it hands to gRPC are watched by the Frames returned.
func WatchFrames(tc credentials.TransportCredentials) (credentials.TransportCredentials, *Frames) {
	f := &Frames{partial: map[*h2stream]struct{}{}}
	return &watchedCreds{TransportCredentials: tc, f: f}, f
}

// partlyRead reports whether a message is partly received on a watched
// connection.
func (f *Frames) partlyRead() bool {
	if f == nil {
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.partial) > 0
}

// stalled reports, of the messages partly received that have made no
// progress for d, when the oldest began.
func (f *Frames) stalled(now time.Time, d time.Duration) (began time.Time, ok bool) {
	if f == nil || d <= 0 {
		return time.Time{}, false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for m := range f.partial {
		if now.Sub(m.progress) >= d && (!ok || m.began.Before(began)) {
			began, ok = m.began, true
		}
	}
	return began, ok
}

// watchedCreds are transport credentials whose connections are watched.
type watchedCreds struct {
	credentials.TransportCredentials
	f *Frames
}

func (c *watchedCreds) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := c.TransportCredentials.ClientHandshake(ctx, authority, raw)
	if err != nil {
		return nil, nil, err
	}
	return newFrameConn(conn, c.f), info, nil
}

func (c *watchedCreds) Clone() credentials.TransportCredentials {
	return &watchedCreds{TransportCredentials: c.TransportCredentials.Clone(), f: c.f}
}

// HTTP/2 (RFC 9113, section 6): the frames and flags the watch reads.
const (
	frameData     = 0x0
	frameHeaders  = 0x1
	frameRSTStrm  = 0x3
	frameGoAway   = 0x7
	flagEndStream = 0x1
	flagPadded    = 0x8
	clientPreface = len("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
)

// frameConn is a watched connection: the plaintext HTTP/2 (after TLS)
// between gRPC and the server. The relay's writes open streams (HEADERS)
// and end them (RST_STREAM); the server's DATA frames carry the messages;
// its END_STREAM or RST_STREAM ends a stream, and its GOAWAY every stream
// past the last it processed (gRPC closes those without a RST_STREAM).
type frameConn struct {
	net.Conn
	f *Frames

	wmu lockorder.Mutex[frameConnWmu]
	out scanner // guarded by wmu
	in  scanner // owned by the reader (gRPC's reader goroutine)

	streams map[uint32]*h2stream // guarded by f.mu
	closed  bool                 // guarded by f.mu
	once    sync.Once
}

func newFrameConn(conn net.Conn, f *Frames) *frameConn {
	return &frameConn{Conn: conn, f: f, out: scanner{skip: clientPreface}, streams: map[uint32]*h2stream{}}
}

func (c *frameConn) Write(p []byte) (int, error) {
	c.wmu.Lock()
	c.out.scan(p, c.wrote, nil)
	c.wmu.Unlock()
	return c.Conn.Write(p)
}

func (c *frameConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.in.scan(p[:n], c.readEnd, c.readData)
	}
	if err != nil {
		c.forget()
	}
	return n, err
}

func (c *frameConn) Close() error {
	c.forget()
	return c.Conn.Close()
}

// forget drops the connection's streams: it carries nothing more.
func (c *frameConn) forget() {
	c.once.Do(func() {
		c.f.mu.Lock()
		defer c.f.mu.Unlock()
		for _, st := range c.streams {
			delete(c.f.partial, st)
		}
		c.streams, c.closed = nil, true
	})
}

// wrote takes a frame the relay sent, once its header is read.
func (c *frameConn) wrote(h frameHeader, end bool) {
	if end {
		return
	}
	c.f.mu.Lock()
	defer c.f.mu.Unlock()
	switch {
	case c.closed:
	case h.typ == frameHeaders && c.streams[h.stream] == nil:
		c.streams[h.stream] = &h2stream{}
	case h.typ == frameRSTStrm:
		c.endLocked(h.stream)
	}
}

// readEnd takes the end of a frame the server sent.
func (c *frameConn) readEnd(h frameHeader, end bool) {
	if end && h.typ == frameGoAway && h.length >= 8 {
		c.f.mu.Lock()
		defer c.f.mu.Unlock()
		for id := range c.streams {
			if id > h.lastStream {
				c.endLocked(id)
			}
		}
		return
	}
	if !end || !(h.typ == frameRSTStrm || h.flags&flagEndStream != 0 && (h.typ == frameData || h.typ == frameHeaders)) {
		return
	}
	c.f.mu.Lock()
	defer c.f.mu.Unlock()
	c.endLocked(h.stream)
}

func (c *frameConn) endLocked(id uint32) {
	if st := c.streams[id]; st != nil {
		delete(c.f.partial, st)
		delete(c.streams, id)
	}
}

// readData takes DATA payload (padding left out) of a stream: gRPC's
// length-prefixed messages ("Length-Prefixed-Message", gRPC over HTTP/2).
func (c *frameConn) readData(id uint32, p []byte) {
	now := time.Now()
	c.f.mu.Lock()
	defer c.f.mu.Unlock()
	st := c.streams[id]
	if st == nil {
		return // a stream the relay has reset, or not one of its own
	}
	for len(p) > 0 {
		if st.got < len(st.prefix) {
			if st.got == 0 {
				st.began = now
				c.f.partial[st] = struct{}{}
			}
			n := copy(st.prefix[st.got:], p)
			st.got += n
			p = p[n:]
			if st.got == len(st.prefix) {
				st.left = binary.BigEndian.Uint32(st.prefix[1:])
			}
		} else {
			n := min(uint32(len(p)), st.left)
			st.left -= n
			p = p[n:]
		}
		if st.got == len(st.prefix) && st.left == 0 {
			st.got = 0 // complete
			delete(c.f.partial, st)
		}
	}
	st.progress = now
}

// frameHeader is an HTTP/2 frame's 9-byte header.
type frameHeader struct {
	length int
	typ    byte
	flags  byte
	stream uint32

	lastStream uint32 // a GOAWAY's last stream processed, once its payload is read
}

// scanner follows the frames of one direction of a connection through
// reads or writes of any size.
type scanner struct {
	skip   int // bytes to pass over: the preface, a payload not read, padding
	hdr    [9]byte
	got    int // bytes of hdr read; 9 while in a frame's payload
	h      frameHeader
	goAway int  // bytes of a GOAWAY's last stream ID still to read
	pad    bool // a DATA frame's pad length is the next byte
	data   int  // DATA payload still to come
	after  int  // padding after the data
}

// scan reads p: frame is called at each frame's header (end false) and at
// its end (end true); data, if not nil, with DATA payload.
func (s *scanner) scan(p []byte, frame func(h frameHeader, end bool), data func(id uint32, p []byte)) {
	for len(p) > 0 {
		switch {
		case s.goAway > 0:
			n := min(s.goAway, len(p))
			for _, b := range p[:n] {
				s.h.lastStream = s.h.lastStream<<8 | uint32(b)
			}
			if s.goAway -= n; s.goAway == 0 {
				s.h.lastStream &= 0x7fffffff // the reserved bit
			}
			p = p[n:]
		case s.skip > 0:
			n := min(s.skip, len(p))
			s.skip -= n
			p = p[n:]
		case s.got < len(s.hdr):
			n := copy(s.hdr[s.got:], p)
			s.got += n
			p = p[n:]
			if s.got == len(s.hdr) {
				s.header(frame)
			}
		case s.pad:
			s.pad = false
			padLen := int(p[0])
			p = p[1:]
			s.data = max(s.h.length-1-padLen, 0)
			s.after = s.h.length - 1 - s.data
		default: // DATA payload
			n := min(s.data, len(p))
			if data != nil {
				data(s.h.stream, p[:n])
			}
			s.data -= n
			p = p[n:]
		}
		if s.got == len(s.hdr) && s.skip == 0 && !s.pad && s.data == 0 && s.goAway == 0 {
			if s.after > 0 {
				s.skip, s.after = s.after, 0
				continue
			}
			s.got = 0
			frame(s.h, true)
		}
	}
}

// header takes a frame header just read.
func (s *scanner) header(frame func(h frameHeader, end bool)) {
	b := s.hdr[:]
	s.h = frameHeader{
		length: int(b[0])<<16 | int(b[1])<<8 | int(b[2]),
		typ:    b[3], flags: b[4],
		stream: binary.BigEndian.Uint32(b[5:]) & 0x7fffffff,
	}
	frame(s.h, false)
	switch {
	case s.h.typ == frameGoAway && s.h.length >= 8:
		s.goAway, s.skip = 4, s.h.length-4 // the last stream ID, then the rest
	case s.h.typ == frameData && s.h.flags&flagPadded != 0 && s.h.length > 0:
		s.pad = true
	case s.h.typ == frameData:
		s.data = s.h.length
	default:
		s.skip = s.h.length
	}
}
