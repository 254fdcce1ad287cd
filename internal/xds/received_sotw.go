package xds

import (
	"sync"

	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/anypb"
)

// SotWReceived is a state-of-the-world DiscoveryResponse received from
// upstream, read into the Received the delta stream gives, so that the
// rest of the relay speaks one vocabulary (docs/architecture.md, invariant
// 16). Install Codec on the SotW call and receive one with RecvMsg.
//
// Each resource becomes a delta Resource: its name read from the resource
// (or from its Resource wrapper, "Resource wrappers" in SotW, with TTL and
// heartbeat), and no version, so that Encode gives it one from its bytes:
// the same bytes have the same version across responses, reconnects and
// servers, and a response that brings them again changes nothing. A
// wrapper's own version is dropped for that reason. RemovedResources is
// never set: what absence means is the session's to decide (only Listener
// and Cluster, "Deleting Resources").
type SotWReceived struct {
	Received
}

var (
	sotwFields = (&discoverypb.DiscoveryResponse{}).ProtoReflect().Descriptor().Fields()
)

// unmarshal decodes a DiscoveryResponse held in gRPC's buffers, checking
// every field as proto.Unmarshal would.
func (r *SotWReceived) unmarshal(data mem.BufferSlice) error {
	r.Received = Received{Size: data.Len(), StateOfTheWorld: true}
	return eachField(data, sotwFields, func(c *cursor, fd protoreflect.FieldDescriptor, n int) error {
		v := make([]byte, n)
		c.read(v)
		if err := validateBytesField(v, fd, 0); err != nil {
			return err
		}
		return r.field(fd.Number(), v)
	})
}

func (r *SotWReceived) field(num protowire.Number, v []byte) error {
	switch num {
	case sotwVersion:
		r.SystemVersionInfo = string(v)
	case sotwTypeURL:
		r.TypeURL = string(v)
	case sotwNonce:
		r.Nonce = string(v)
	case sotwErrors:
		e := new(discoverypb.ResourceError)
		if err := proto.Unmarshal(v, e); err != nil {
			return err
		}
		r.ResourceErrors = append(r.ResourceErrors, e)
	case sotwResources:
		res, err := sotwResource(v)
		if err != nil {
			return err
		}
		r.Resources = append(r.Resources, res)
	}
	return nil
}

// sotwResource reads one Any of a SotW response as a delta resource.
func sotwResource(anyMsg []byte) (ReceivedResource, error) {
	typeURL, value, ok := canonicalAny(anyMsg)
	if !ok {
		a := new(anypb.Any)
		if err := proto.Unmarshal(anyMsg, a); err != nil {
			return ReceivedResource{}, err
		}
		typeURL, value = a.GetTypeUrl(), a.GetValue()
	}
	if typeURL == resourceTypeURL {
		// A wrapper: its value is the Resource itself.
		res, err := newReceivedResource(deltaField(value))
		if err != nil {
			return ReceivedResource{}, err
		}
		res.Version = ""
		if res.pb != nil {
			res.pb.Version = ""
		}
		return res, nil
	}
	// One allocation: the delta field around a Resource of the Any and
	// the name.
	name := NameOf(typeURL, value)
	n := protowire.SizeTag(resResource) + protowire.SizeBytes(len(anyMsg))
	if name != "" {
		n += protowire.SizeTag(resName) + protowire.SizeBytes(len(name))
	}
	f := make([]byte, 0, protowire.SizeTag(deltaResources)+protowire.SizeBytes(n))
	f = protowire.AppendVarint(protowire.AppendTag(f, deltaResources, protowire.BytesType), uint64(n))
	f = protowire.AppendBytes(protowire.AppendTag(f, resResource, protowire.BytesType), anyMsg)
	if name != "" {
		f = protowire.AppendString(protowire.AppendTag(f, resName, protowire.BytesType), name)
	}
	return newReceivedResource(f)
}

// deltaField is a delta resources field holding the Resource body.
func deltaField(body []byte) []byte {
	f := make([]byte, 0, protowire.SizeTag(deltaResources)+protowire.SizeBytes(len(body)))
	f = protowire.AppendTag(f, deltaResources, protowire.BytesType)
	return protowire.AppendBytes(f, body)
}

var nameFields sync.Map // type URL → protowire.Number (0: none)

// NameOf is the name of a resource of typeURL held in value (the Any's
// value): its name field, or cluster_name for a ClusterLoadAssignment,
// read as proto.Unmarshal would (the last one wins) without decoding the
// resource. "" if the type is unknown or has no such field.
func NameOf(typeURL string, value []byte) string {
	num, ok := nameFields.Load(typeURL)
	if !ok {
		num = nameField(typeURL)
		if Known(typeURL) { // bounded: the types the relay carries
			nameFields.Store(typeURL, num)
		}
	}
	if num.(protowire.Number) == 0 {
		return ""
	}
	s, _ := lastString(value, num.(protowire.Number))
	return s
}

func nameField(typeURL string) protowire.Number {
	mt, err := protoregistry.GlobalTypes.FindMessageByURL(typeURL)
	if err != nil {
		return 0
	}
	fields := mt.Descriptor().Fields()
	for _, f := range []protoreflect.Name{"name", "cluster_name"} {
		if fd := fields.ByName(f); fd != nil && fd.Kind() == protoreflect.StringKind {
			return fd.Number()
		}
	}
	return 0
}
