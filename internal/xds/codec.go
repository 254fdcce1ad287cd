package xds

import (
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
)

// Codec is gRPC's proto codec, except that a *Message is written as the bytes
// it already holds, and a *Received is decoded by hand from the received
// frames (a *SotWReceived from a state-of-the-world response). Install it on a server with grpc.ForceServerCodecV2 and send a
// *Message with the stream's SendMsg; on a client's delta-ADS call with
// grpc.ForceCodecV2, and receive a *Received with the stream's RecvMsg.
type Codec struct{}

var protoCodec = encoding.GetCodecV2(proto.Name)

// Marshal implements encoding.CodecV2.
func (Codec) Marshal(v any) (mem.BufferSlice, error) {
	if m, ok := v.(*Message); ok {
		return m.wireParts(), nil
	}
	return protoCodec.Marshal(v)
}

// Unmarshal implements encoding.CodecV2.
func (Codec) Unmarshal(data mem.BufferSlice, v any) error {
	switch r := v.(type) {
	case *Received:
		return r.unmarshal(data)
	case *SotWReceived:
		return r.unmarshal(data)
	}
	return protoCodec.Unmarshal(data, v)
}

// Name implements encoding.CodecV2.
func (Codec) Name() string { return proto.Name }
