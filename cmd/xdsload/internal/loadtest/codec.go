package loadtest

import (
	"errors"
	"fmt"

	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc/encoding"
	_ "google.golang.org/grpc/encoding/proto" // registers the "proto" codec
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// markCodec is the fan-out clients' codec. Requests are marshalled by
// gRPC's proto codec. A response is read with protowire, keeping only what
// these clients use: its nonce and version, and for each resource its type
// URL and the update mark it carries (see seqCoding), as an Any whose value
// holds the mark alone.
//
// A full decode copies every resource's bytes into the client's heap: with
// 100,000 clients on the machine that also runs the server, that is 1 GiB a
// change to collect, and the clients' garbage collector (scanning 100,000
// goroutine stacks) took a third of their CPU and set how long a change
// took to reach every client (BENCHMARKS.md, "Fan-out at 100,000 streams").
// What is measured is the server; the clients now stay out of its way.
type markCodec struct {
	proto  encoding.CodecV2
	coding seqCoding
	// marks[s] is the Any value that carries update s's mark and nothing
	// else; a resource whose mark is not this run's gets no value, which
	// seqOf reads as -1, as it would the whole resource.
	marks [][]byte
}

var _ encoding.CodecV2 = (*markCodec)(nil)

func newMarkCodec(coding seqCoding) *markCodec {
	c := &markCodec{proto: encoding.GetCodecV2("proto"), coding: coding, marks: make([][]byte, coding.updates+1)}
	for s := range c.marks {
		c.marks[s] = encodeAt(coding.kind.markPath, uint64(coding.base)+uint64(s))
	}
	return c
}

// Name is "proto": the content-subtype servers expect.
func (c *markCodec) Name() string { return c.proto.Name() }

func (c *markCodec) Marshal(v any) (mem.BufferSlice, error) { return c.proto.Marshal(v) }

func (c *markCodec) Unmarshal(data mem.BufferSlice, v any) error {
	switch m := v.(type) {
	case *discoverypb.DeltaDiscoveryResponse:
		proto.Reset(m) // as the proto codec does
		return c.read(data, func(b []byte) error {
			return envelope(b, &m.SystemVersionInfo, &m.Nonce, func(v []byte) error {
				r := &discoverypb.Resource{}
				m.Resources = append(m.Resources, r)
				return fields(v, func(num protowire.Number, v []byte) (err error) {
					if num == resourceBody {
						r.Resource, err = c.any(v)
					}
					return err
				})
			})
		})
	case *discoverypb.DiscoveryResponse:
		proto.Reset(m)
		return c.read(data, func(b []byte) error {
			return envelope(b, &m.VersionInfo, &m.Nonce, func(v []byte) error {
				a, err := c.any(v)
				m.Resources = append(m.Resources, a)
				return err
			})
		})
	}
	return c.proto.Unmarshal(data, v)
}

// read hands parse the message's bytes, in one piece.
func (c *markCodec) read(data mem.BufferSlice, parse func([]byte) error) error {
	if len(data) == 1 {
		return parse(data[0].ReadOnlyData())
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	return parse(buf.ReadOnlyData())
}

// Field numbers of envoy.service.discovery.v3 and google.protobuf.Any. A
// DiscoveryResponse and a DeltaDiscoveryResponse number their version,
// resources and nonce alike.
const (
	respVersion, respResources, respNonce = 1, 2, 5
	resourceBody                          = 2 // Resource.resource
	anyTypeURL, anyValue                  = 1, 2
)

// envelope reads response b: its version and nonce into version and nonce,
// and each resource's bytes through resource.
func envelope(b []byte, version, nonce *string, resource func([]byte) error) error {
	return fields(b, func(num protowire.Number, v []byte) error {
		switch num {
		case respVersion:
			*version = string(v)
		case respNonce:
			*nonce = string(v)
		case respResources:
			return resource(v)
		}
		return nil
	})
}

// any is an Any with b's type URL and, for a resource of the loaded kind,
// the value that carries its mark alone.
func (c *markCodec) any(b []byte) (*anypb.Any, error) {
	var typeURL, value []byte
	err := fields(b, func(num protowire.Number, v []byte) error {
		switch num {
		case anyTypeURL:
			typeURL = v
		case anyValue:
			value = v
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if string(typeURL) != c.coding.kind.typeURL {
		return &anypb.Any{TypeUrl: string(typeURL)}, nil
	}
	a := &anypb.Any{TypeUrl: c.coding.kind.typeURL}
	if s := c.coding.markOf(value); s >= 0 {
		a.Value = c.marks[s]
	}
	return a, nil
}

// fields calls f with the number and bytes of each length-delimited field
// of message b; other fields are skipped.
func fields(b []byte, f func(protowire.Number, []byte) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return fmt.Errorf("markCodec: %w", protowire.ParseError(n))
		}
		b = b[n:]
		if typ != protowire.BytesType {
			if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
				return fmt.Errorf("markCodec: %w", protowire.ParseError(n))
			}
			b = b[n:]
			continue
		}
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return fmt.Errorf("markCodec: %w", protowire.ParseError(n))
		}
		b = b[n:]
		if err := f(num, v); err != nil {
			return err
		}
	}
	return nil
}

// encodeAt is the message that holds v at path and nothing else: what
// varintAt reads back.
func encodeAt(path []protowire.Number, v uint64) []byte {
	if len(path) == 0 {
		panic(errors.New("encodeAt: empty path"))
	}
	b := protowire.AppendTag(nil, path[len(path)-1], protowire.VarintType)
	b = protowire.AppendVarint(b, v)
	for i := len(path) - 2; i >= 0; i-- {
		outer := protowire.AppendTag(nil, path[i], protowire.BytesType)
		b = protowire.AppendBytes(outer, b)
	}
	return b
}
