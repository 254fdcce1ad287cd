package xds

import (
	"fmt"

	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// Received is a DeltaDiscoveryResponse as the relay receives it from
// upstream: Codec decodes it by hand from gRPC's received frames, keeping
// each resource as its encoded bytes (one copy, out of the frames) instead
// of a decoded proto, so that the relay's encodings are built from them,
// mostly without copying (ReceivedResource.Encode). It accepts and rejects
// what proto.Unmarshal does. Fields the relay does not use
// (removed_resource_names, control_plane, unknown fields) are checked and
// dropped.
type Received struct {
	SystemVersionInfo string
	TypeURL           string
	Nonce             string
	Resources         []ReceivedResource
	RemovedResources  []string
	ResourceErrors    []*discoverypb.ResourceError
	Size              int // the encoded size, as received
	// StateOfTheWorld is set for a SotW response (SotWReceived): it holds
	// every resource of its type the stream is subscribed to ("Grouping
	// Resources into Responses"), and removes nothing by itself.
	StateOfTheWorld bool
	// Unserved is set, with TypeURL alone, to the error with which the
	// server refused the per-type state-of-the-world service of that type
	// (UNIMPLEMENTED, or its own words): not a response, but what the
	// stream learned of the server.
	Unserved error
}

var deltaFields = (&discoverypb.DeltaDiscoveryResponse{}).ProtoReflect().Descriptor().Fields()

// unmarshal decodes a DeltaDiscoveryResponse held in gRPC's buffers. Every
// field is checked as proto.Unmarshal would (validateBytesField); a
// resource is copied out of the buffers once, into its own allocation, which
// becomes (or from which is built) its encoding.
func (r *Received) unmarshal(data mem.BufferSlice) error {
	*r = Received{Size: data.Len()}
	return eachField(data, deltaFields, r.field)
}

// eachField reads a message held in gRPC's buffers field by field, as
// proto.Unmarshal would: each known length-delimited field of fields is
// read by read, given its length; the others are checked and skipped.
func eachField(data mem.BufferSlice, fields protoreflect.FieldDescriptors, read func(c *cursor, fd protoreflect.FieldDescriptor, n int) error) error {
	c := newCursor(data)
	for c.left > 0 {
		num, typ, err := c.tag(false)
		if err != nil {
			return err
		}
		fd := fields.ByNumber(num)
		if typ == protowire.EndGroupType || fd == nil || typ != protowire.BytesType {
			// Unknown, or a known field sent with another wire type, which
			// proto.Unmarshal keeps as unknown.
			if err := c.skipValue(num, typ, protowire.DefaultRecursionLimit); err != nil {
				return err
			}
			continue
		}
		n, err := c.length()
		if err != nil {
			return err
		}
		if err := read(c, fd, n); err != nil {
			return fmt.Errorf("%s: %w", fd.FullName(), err)
		}
	}
	return nil
}

// field reads the n bytes of a length-delimited field fd.
func (r *Received) field(c *cursor, fd protoreflect.FieldDescriptor, n int) error {
	if fd.Number() == deltaResources {
		res, err := readResource(c, fd, n)
		if err != nil {
			return err
		}
		r.Resources = append(r.Resources, res)
		return nil
	}
	v := make([]byte, n)
	c.read(v)
	if err := validateBytesField(v, fd, 0); err != nil {
		return err
	}
	switch fd.Number() {
	case deltaVersion:
		r.SystemVersionInfo = string(v)
	case deltaTypeURL:
		r.TypeURL = string(v)
	case deltaNonce:
		r.Nonce = string(v)
	case deltaRemoved:
		r.RemovedResources = append(r.RemovedResources, string(v))
	case deltaErrors:
		e := new(discoverypb.ResourceError)
		if err := proto.Unmarshal(v, e); err != nil {
			return err
		}
		r.ResourceErrors = append(r.ResourceErrors, e)
	}
	return nil
}

// readResource copies a resources field of n bytes out of the buffers, as
// the delta resources field it is (tag, length, Resource: what Encode
// builds as Resource.Wire), and reads it.
func readResource(c *cursor, fd protoreflect.FieldDescriptor, n int) (ReceivedResource, error) {
	field := make([]byte, 0, protowire.SizeTag(deltaResources)+protowire.SizeBytes(n))
	field = protowire.AppendVarint(protowire.AppendTag(field, deltaResources, protowire.BytesType), uint64(n))
	body := field[len(field) : len(field)+n]
	c.read(body)
	if err := validateBytesField(body, fd, 0); err != nil {
		return ReceivedResource{}, err
	}
	return newReceivedResource(field[:len(field)+n])
}
