package upstream

import (
	"bytes"
	"encoding/binary"
	"io"
	"maps"
	"net"
	"slices"
	"testing"
	"time"

	"golang.org/x/net/http2"
)

// pipeConn is a connection whose reads come from in and whose writes are
// dropped: the watch sees what passes, in pieces of any size.
type pipeConn struct {
	net.Conn
	in bytes.Buffer
}

func (p *pipeConn) Read(b []byte) (int, error) {
	if p.in.Len() == 0 {
		return 0, io.EOF
	}
	return p.in.Read(b)
}
func (p *pipeConn) Write(b []byte) (int, error) { return len(b), nil }
func (p *pipeConn) Close() error                { return nil }

// frameWriter builds HTTP/2 frames with x/net's framer.
type frameWriter struct {
	buf bytes.Buffer
	fr  *http2.Framer
}

func newFrameWriter() *frameWriter {
	w := &frameWriter{}
	w.fr = http2.NewFramer(&w.buf, nil)
	return w
}

// take returns what was framed since the last take.
func (w *frameWriter) take() []byte {
	out := bytes.Clone(w.buf.Bytes())
	w.buf.Reset()
	return out
}

// grpcMessage is a gRPC length-prefixed message of n bytes.
func grpcMessage(n int) []byte {
	out := make([]byte, 5+n)
	binary.BigEndian.PutUint32(out[1:], uint32(n))
	return out
}

// feed passes b through c, written (the relay's side) or read (the
// server's), in pieces of 1 to 7 bytes.
func feed(t *testing.T, c *frameConn, pc *pipeConn, write bool, b []byte) {
	t.Helper()
	for i, size := 0, 1; i < len(b); i, size = i+size, size%7+1 {
		piece := b[i:min(i+size, len(b))]
		if write {
			if _, err := c.Write(piece); err != nil {
				t.Fatal(err)
			}
			continue
		}
		pc.in.Write(piece)
		buf := make([]byte, len(piece))
		if _, err := io.ReadFull(c, buf); err != nil {
			t.Fatal(err)
		}
	}
}

// watched is a watched connection and a framer for it: client passes what
// build frames as the relay's writes, server as the server's.
func watched(t *testing.T) (f *Frames, c *frameConn, w *frameWriter, client, server func(build func())) {
	_, f = WatchFrames(nil)
	pc := &pipeConn{}
	c = newFrameConn(pc, f)
	w = newFrameWriter()
	client = func(build func()) { build(); feed(t, c, pc, true, w.take()) }
	server = func(build func()) { build(); feed(t, c, pc, false, w.take()) }
	return f, c, w, client, server
}

// The watch follows gRPC's messages through HTTP/2 frames cut anywhere:
// padded DATA, a message over several frames, streams the relay did not
// open, a stream the relay resets, trailers, the connection's end.
func TestFramesFollowMessages(t *testing.T) {
	f, c, w, client, server := watched(t)

	client(func() {
		w.buf.WriteString(http2.ClientPreface)
		w.fr.WriteSettings()
		for _, id := range []uint32{1, 3} {
			w.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: []byte("hpack"), EndHeaders: true})
		}
	})
	if f.partlyRead() {
		t.Fatal("partly read before any DATA")
	}
	msg := grpcMessage(1000)
	server(func() {
		w.fr.WriteSettings()
		w.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: []byte("hpack"), EndHeaders: true})
		w.fr.WriteDataPadded(1, false, msg[:300], make([]byte, 7))
		w.fr.WritePing(false, [8]byte{})
	})
	if !f.partlyRead() {
		t.Fatal("a message begun is not partly read")
	}
	if _, ok := f.stalled(time.Now(), time.Hour); ok {
		t.Fatal("stalled before its bound")
	}
	if _, ok := f.stalled(time.Now().Add(time.Hour), time.Hour); !ok {
		t.Fatal("not stalled past its bound")
	}
	server(func() {
		w.fr.WriteData(1, false, msg[300:600])
		w.fr.WriteDataPadded(1, false, msg[600:], []byte{0})
	})
	if f.partlyRead() {
		t.Fatal("a complete message is still partly read")
	}

	// Two messages in a frame, the second cut; stream 5 is not the relay's.
	next := append(grpcMessage(0), grpcMessage(10)[:8]...)
	server(func() {
		w.fr.WriteData(5, false, grpcMessage(10)[:3])
		w.fr.WriteData(1, false, next)
	})
	if !f.partlyRead() {
		t.Fatal("the second message of a frame is not partly read")
	}
	server(func() {
		w.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: []byte("trailers"), EndHeaders: true, EndStream: true})
	})
	if f.partlyRead() {
		t.Fatal("a stream ended by its trailers is still partly read")
	}

	// The relay resets a stream half-way through a message.
	server(func() { w.fr.WriteData(3, false, grpcMessage(10)[:2]) })
	if !f.partlyRead() {
		t.Fatal("a cut prefix is not partly read")
	}
	client(func() { w.fr.WriteRSTStream(3, http2.ErrCodeCancel) })
	if f.partlyRead() {
		t.Fatal("a stream the relay reset is still partly read")
	}
	server(func() { w.fr.WriteData(3, false, grpcMessage(10)) })
	if f.partlyRead() {
		t.Fatal("DATA of a reset stream is read")
	}

	// The connection ends half-way through a message.
	client(func() {
		w.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 7, BlockFragment: []byte("hpack"), EndHeaders: true})
	})
	server(func() { w.fr.WriteData(7, false, grpcMessage(10)[:9]) })
	if !f.partlyRead() {
		t.Fatal("not partly read")
	}
	c.Close()
	if f.partlyRead() {
		t.Fatal("a closed connection is still partly read")
	}
}

// BenchmarkFramesRead is the watch's cost on what a connection reads: a
// 10 MiB response in 16 KiB DATA frames, read in gRPC's 32 KiB pieces.
func BenchmarkFramesRead(b *testing.B) {
	w := newFrameWriter()
	msg := grpcMessage(10 << 20)
	for i := 0; i < len(msg); i += 16 << 10 {
		w.fr.WriteData(1, false, msg[i:min(i+16<<10, len(msg))])
	}
	frames := w.take()
	w.buf.WriteString(http2.ClientPreface)
	w.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: []byte("hpack"), EndHeaders: true})
	opening := w.take()
	buf := make([]byte, 32<<10)
	b.SetBytes(int64(len(frames)))
	b.ReportAllocs()
	for b.Loop() {
		_, f := WatchFrames(nil)
		pc := &pipeConn{}
		c := newFrameConn(pc, f)
		c.Write(opening)
		pc.in.Write(frames)
		for {
			if _, err := c.Read(buf); err != nil {
				break
			}
		}
	}
}

// The server's side of a stream's end, and lengths it may not mean: its
// RST_STREAM or a DATA frame with END_STREAM ends a stream half-way through
// a message; a prefix announcing 4 GiB costs nothing; padding longer than
// its frame is passed over. No stream outlives its end.
func TestFramesServerEndsAndHostileLengths(t *testing.T) {
	f, c, w, client, server := watched(t)
	open := func(ids ...uint32) {
		client(func() {
			for _, id := range ids {
				w.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: []byte("hpack"), EndHeaders: true})
			}
		})
	}
	client(func() { w.buf.WriteString(http2.ClientPreface) })
	open(1, 3)

	huge := grpcMessage(0)
	binary.BigEndian.PutUint32(huge[1:], 0xffffffff)
	server(func() { w.fr.WriteData(1, false, append(huge, 1, 2, 3)) })
	if !f.partlyRead() {
		t.Fatal("a message announcing 4 GiB is not partly read")
	}
	server(func() { w.fr.WriteRSTStream(1, http2.ErrCodeInternal) })
	if f.partlyRead() {
		t.Fatal("a stream the server reset is still partly read")
	}

	server(func() { w.fr.WriteData(3, true, grpcMessage(10)[:7]) })
	if f.partlyRead() {
		t.Fatal("a stream the server ended with its DATA is still partly read")
	}

	// A padded DATA frame whose pad length exceeds the frame: no data, the
	// rest passed over, and the frames after it still followed.
	open(5)
	server(func() {
		w.buf.Write([]byte{0, 0, 3, frameData, flagPadded, 0, 0, 0, 5, 200, 0, 0})
		w.fr.WriteData(5, false, grpcMessage(10)[:4])
	})
	if !f.partlyRead() {
		t.Fatal("the frame after an overlong padding is not followed")
	}
	server(func() { w.fr.WriteRSTStream(5, http2.ErrCodeCancel) })

	// Many streams opened and ended leave none behind.
	for id := uint32(7); id < 2007; id += 2 {
		open(id)
		server(func() { w.fr.WriteData(id, false, grpcMessage(3)[:2]) })
		if id%4 == 1 {
			server(func() { w.fr.WriteRSTStream(id, http2.ErrCodeCancel) })
		} else {
			client(func() { w.fr.WriteRSTStream(id, http2.ErrCodeCancel) })
		}
	}
	f.mu.Lock()
	streams, partial := len(c.streams), len(f.partial)
	f.mu.Unlock()
	if streams != 0 || partial != 0 {
		t.Fatalf("after every stream ended: %d streams and %d messages held, want none", streams, partial)
	}
}

// A GOAWAY ends the streams past the last one the server processed: gRPC
// closes them without a RST_STREAM. The streams up to it go on.
func TestFramesGoAwayEndsUnprocessedStreams(t *testing.T) {
	f, c, w, client, server := watched(t)
	client(func() {
		w.buf.WriteString(http2.ClientPreface)
		for _, id := range []uint32{1, 3, 5, 7} {
			w.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: []byte("hpack"), EndHeaders: true})
		}
	})
	held := func() []uint32 {
		f.mu.Lock()
		defer f.mu.Unlock()
		return slices.Sorted(maps.Keys(c.streams))
	}
	// gRPC's first GOAWAY of a graceful close names the largest stream ID.
	server(func() { w.fr.WriteGoAway(1<<31-1, http2.ErrCodeNo, []byte("graceful")) })
	if got := held(); !slices.Equal(got, []uint32{1, 3, 5, 7}) {
		t.Fatalf("streams after a GOAWAY naming them all: %v", got)
	}
	server(func() {
		w.fr.WriteGoAway(3, http2.ErrCodeNo, []byte("max_connection_age"))
		w.fr.WriteData(3, false, grpcMessage(10)[:4])
	})
	if got := held(); !slices.Equal(got, []uint32{1, 3}) {
		t.Fatalf("streams after a GOAWAY at 3: %v, want [1 3]", got)
	}
	if !f.partlyRead() {
		t.Fatal("a processed stream's message after the GOAWAY is not followed")
	}
}
