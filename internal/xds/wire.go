package xds

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"sync"

	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/genproto/googleapis/rpc/code"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Field numbers of the response messages, read from their descriptors so
// that nothing here restates the protos.
var (
	sotwVersion   = field(&discoverypb.DiscoveryResponse{}, "version_info")
	sotwResources = field(&discoverypb.DiscoveryResponse{}, "resources")
	sotwTypeURL   = field(&discoverypb.DiscoveryResponse{}, "type_url")
	sotwNonce     = field(&discoverypb.DiscoveryResponse{}, "nonce")

	deltaVersion   = field(&discoverypb.DeltaDiscoveryResponse{}, "system_version_info")
	deltaResources = field(&discoverypb.DeltaDiscoveryResponse{}, "resources")
	deltaTypeURL   = field(&discoverypb.DeltaDiscoveryResponse{}, "type_url")
	deltaRemoved   = field(&discoverypb.DeltaDiscoveryResponse{}, "removed_resources")
	deltaNonce     = field(&discoverypb.DeltaDiscoveryResponse{}, "nonce")
	deltaErrors    = field(&discoverypb.DeltaDiscoveryResponse{}, "resource_errors")
	sotwErrors     = field(&discoverypb.DiscoveryResponse{}, "resource_errors")

	resVersion  = field(&discoverypb.Resource{}, "version")
	resResource = field(&discoverypb.Resource{}, "resource")
	resName     = field(&discoverypb.Resource{}, "name")
	resAliases  = field(&discoverypb.Resource{}, "aliases")
)

// EncodeError encodes a per-resource error once, as the resource_errors
// field of delta and SotW responses (xDS TP3, gRFC A88).
func EncodeError(e *discoverypb.ResourceError) (*ResourceError, error) {
	b, err := marshal.Marshal(e)
	if err != nil {
		return nil, err
	}
	return &ResourceError{
		Name:    e.GetResourceName().GetName(),
		Code:    e.GetErrorDetail().GetCode(),
		Message: e.GetErrorDetail().GetMessage(),
		Delta:   protowire.AppendBytes(protowire.AppendTag(nil, deltaErrors, protowire.BytesType), b),
		SotW:    protowire.AppendBytes(protowire.AppendTag(nil, sotwErrors, protowire.BytesType), b),
	}, nil
}

// NewError is an error the relay makes for one resource, encoded: the
// relay knows the answer (an authority nobody serves, a name refused, a
// control plane that cannot be reached) and says so rather than leave the
// client to its does-not-exist timer.
func NewError(name string, code codes.Code, message string) *ResourceError {
	e, err := EncodeError(&discoverypb.ResourceError{ResourceName: &discoverypb.ResourceName{Name: name},
		ErrorDetail: &rpcstatus.Status{Code: int32(code), Message: message}})
	if err != nil {
		panic(fmt.Sprintf("xds: encode a resource error: %v", err)) // a name and a message always encode
	}
	return e
}

// DataError reports whether a per-resource error with code says that the
// name is not to be had, rather than not to be had now (gRFC A88's data
// errors): NOT_FOUND (it does not exist), PERMISSION_DENIED (refused to
// the client), INVALID_ARGUMENT (it is not valid) and RESOURCE_EXHAUSTED
// (refused at a bound). Any other code (UNAVAILABLE, INTERNAL,
// UNKNOWN...) says only that it cannot be fetched now: the name is not
// known not to exist (docs/architecture.md, invariant 21).
func DataError(c int32) bool {
	switch codes.Code(c) {
	case codes.NotFound, codes.PermissionDenied, codes.InvalidArgument, codes.ResourceExhausted:
		return true
	}
	return false
}

// CodeName is a google.rpc.Code as the protos name it (NOT_FOUND,
// UNAVAILABLE...), for metric labels; UNKNOWN for a code out of range.
func CodeName(c int32) string {
	if name, ok := code.Code_name[c]; ok {
		return name
	}
	return code.Code_UNKNOWN.String()
}

func field(m proto.Message, name protoreflect.Name) protowire.Number {
	fd := m.ProtoReflect().Descriptor().Fields().ByName(name)
	if fd == nil {
		panic(fmt.Sprintf("xds: %s has no field %s", m.ProtoReflect().Descriptor().FullName(), name))
	}
	return fd.Number()
}

var marshal = proto.MarshalOptions{Deterministic: true}

// Encode decodes a resource received as an Any (so that a resource the relay
// cannot decode is caught here and NACKed) and encodes it once into the
// bytes that SotW and delta responses carry. An empty version is replaced by
// a hash of the resource's bytes.
func Encode(name, version string, a *anypb.Any, ttl *durationpb.Duration, aliases []string) (*Resource, error) {
	if name == "" {
		return nil, errNoName(a.GetTypeUrl())
	}
	if err := validate(a); err != nil {
		return nil, errUndecodable(name, a.GetTypeUrl(), err)
	}
	r := &Resource{Name: name, Version: version, Aliases: aliases, Warm: Warm(a.GetTypeUrl(), a.GetValue()),
		Refs: Refs(a.GetTypeUrl(), a.GetValue())}
	if version != "" && ttl == nil && resResource == sotwResources && resVersion < resResource && resResource < resName && resName < resAliases {
		// The Any field of a Resource and of a SotW response are the
		// same bytes: one copy of the resource serves both, marshalled
		// straight into place.
		var err error
		if r.Wire, r.Any, err = shareAny(name, version, a, aliases); err != nil {
			return nil, fmt.Errorf("resource %q: %w", name, err)
		}
		return r, nil
	}
	anyBytes, err := marshal.Marshal(a)
	if err != nil {
		return nil, fmt.Errorf("resource %q: %w", name, err)
	}
	if version == "" {
		sum := sha256.Sum256(anyBytes)
		version = hex.EncodeToString(sum[:8])
		r.Version = version
	}
	var wire []byte
	wire, err = marshal.Marshal(&discoverypb.Resource{
		Name: name, Version: version, Resource: a, Ttl: ttl, Aliases: aliases,
	})
	if err != nil {
		return nil, fmt.Errorf("resource %q: %w", name, err)
	}
	r.Any = protowire.AppendBytes(protowire.AppendTag(nil, sotwResources, protowire.BytesType), anyBytes)
	r.Wire = protowire.AppendBytes(protowire.AppendTag(nil, deltaResources, protowire.BytesType), wire)
	if ttl != nil && ttl.AsDuration() > 0 {
		r.TTL = ttl.AsDuration()
		noTTL, err := marshal.Marshal(&discoverypb.Resource{Name: name, Version: version, Resource: a, Aliases: aliases})
		if err != nil {
			return nil, fmt.Errorf("resource %q: %w", name, err)
		}
		r.WireNoTTL = protowire.AppendBytes(protowire.AppendTag(nil, deltaResources, protowire.BytesType), noTTL)
		r.SotWWrapped = wrapSotW(wire)
	}
	return r, nil
}

// shareAny encodes a Resource without TTL as a delta resources field, the
// bytes proto.Marshal would give, and returns with it the SotW resources
// field of its Any: a slice of the same bytes.
func shareAny(name, version string, a *anypb.Any, aliases []string) (wire, sotw []byte, err error) {
	str := func(n protowire.Number, s string) int { return protowire.SizeTag(n) + protowire.SizeBytes(len(s)) }
	anySize := marshal.Size(a)
	body := str(resVersion, version) + protowire.SizeTag(resResource) + protowire.SizeBytes(anySize) + str(resName, name)
	for _, al := range aliases {
		body += str(resAliases, al)
	}
	wire = make([]byte, 0, protowire.SizeTag(deltaResources)+protowire.SizeBytes(body))
	wire = protowire.AppendTag(wire, deltaResources, protowire.BytesType)
	wire = protowire.AppendVarint(wire, uint64(body))
	wire = protowire.AppendString(protowire.AppendTag(wire, resVersion, protowire.BytesType), version)
	start := len(wire)
	wire = protowire.AppendVarint(protowire.AppendTag(wire, resResource, protowire.BytesType), uint64(anySize))
	if wire, err = marshal.MarshalAppend(wire, a); err != nil {
		return nil, nil, err
	}
	if len(wire)-start != protowire.SizeTag(resResource)+protowire.SizeBytes(anySize) {
		return nil, nil, fmt.Errorf("the Any changed size while marshalled")
	}
	sotw = wire[start:len(wire):len(wire)]
	wire = protowire.AppendString(protowire.AppendTag(wire, resName, protowire.BytesType), name)
	for _, al := range aliases {
		wire = protowire.AppendString(protowire.AppendTag(wire, resAliases, protowire.BytesType), al)
	}
	return wire, sotw, nil
}

// resourceTypeURL is the type of a Resource wrapped in an Any, as SotW
// carries resources with a TTL ("TTL").
const resourceTypeURL = "type.googleapis.com/envoy.service.discovery.v3.Resource"

// wrapSotW makes a SotW resources field of an encoded Resource wrapped in an
// Any.
func wrapSotW(resource []byte) []byte {
	a, _ := marshal.Marshal(&anypb.Any{TypeUrl: resourceTypeURL, Value: resource})
	return protowire.AppendBytes(protowire.AppendTag(nil, sotwResources, protowire.BytesType), a)
}

// EncodeHeartbeat encodes a heartbeat: the resource unset, its version, and
// the TTL it refreshes ("TTL").
func EncodeHeartbeat(name, version string, ttl *durationpb.Duration) (*Heartbeat, error) {
	b, err := marshal.Marshal(&discoverypb.Resource{Name: name, Version: version, Ttl: ttl})
	if err != nil {
		return nil, err
	}
	return &Heartbeat{
		Name: name, Version: version, TTL: ttl.AsDuration(),
		Wire: protowire.AppendBytes(protowire.AppendTag(nil, deltaResources, protowire.BytesType), b),
		SotW: wrapSotW(b),
	}, nil
}

// Message is a response already in wire form: a short header and the shared,
// pre-encoded resource fields. The Codec writes it without marshalling.
//
// A response is built for every stream a change reaches, so the usual one
// (a header of a hundred bytes and one or two fields) costs no allocation
// once the relay runs: the header, the parts and what the Codec hands gRPC
// live in the Message, and a Message the Codec wrote goes back to a pool
// once gRPC has written it (see wireParts). A Message is sent once, on one
// stream, and not read once sent: what the sender needs of it (Size) it
// reads before.
type Message struct {
	Parts [][]byte

	head  [128]byte          // the header's storage, while it fits
	parts [3][]byte          // Parts' storage, while they fit
	bufs  [3]mem.SliceBuffer // the Codec's, while they fit
	out   [3]mem.Buffer      // pointing at bufs
	last  []byte             // the last part, held for gRPC by a counted buffer (see wireParts)
}

// messages are Messages that gRPC has written, to be used again.
var messages = sync.Pool{New: func() any { return new(Message) }}

// newMessage returns a Message whose header is begun in its own storage,
// with room in Parts for the header and n fields.
func newMessage(n int) (*Message, []byte) {
	m := messages.Get().(*Message)
	if n+1 <= len(m.parts) {
		m.Parts = m.parts[:0]
	} else {
		m.Parts = make([][]byte, 0, n+1)
	}
	return m, m.head[:0]
}

// wireParts hands gRPC the parts: boxed in the Message's own storage while
// they fit, so that writing a Message allocates nothing for the usual
// response.
//
// The last part is handed over as a reference-counted buffer whose pool
// is the Message itself (written): gRPC holds a reference to each buffer
// it has not written yet, and releases the last one once it has written
// the whole message (the parts are written in order, and the slice of
// buffers is not read after its last buffer is released), so that the
// Message can then be used again. A last part too small for gRPC to count
// (mem.IsBelowBufferPoolingThreshold) is handed over as it is, and its
// Message is left to the garbage collector.
func (m *Message) wireParts() mem.BufferSlice {
	var out mem.BufferSlice
	if len(m.Parts) > len(m.out) {
		out = make(mem.BufferSlice, len(m.Parts))
		for i, p := range m.Parts {
			out[i] = mem.SliceBuffer(p)
		}
	} else {
		out = m.out[:len(m.Parts)]
		for i, p := range m.Parts {
			m.bufs[i] = p
			out[i] = &m.bufs[i]
		}
	}
	if n := len(m.Parts); n > 0 && !mem.IsBelowBufferPoolingThreshold(cap(m.Parts[n-1])) {
		m.last = m.Parts[n-1]
		out[n-1] = mem.NewBuffer(&m.last, (*written)(m))
	}
	return out
}

// written is a Message as the pool of its last part's buffer (see
// wireParts): gRPC puts the part back once it has written the message.
type written Message

// Get is never called: gRPC takes new buffers from the pools it is given,
// and this one is given only for the buffer NewBuffer makes.
func (w *written) Get(n int) *[]byte {
	b := make([]byte, n)
	return &b
}

// Put returns the Message to the pool, keeping none of what it pointed at.
func (w *written) Put(*[]byte) {
	m := (*Message)(w)
	m.Parts, m.last = nil, nil
	clear(m.parts[:])
	clear(m.bufs[:])
	clear(m.out[:])
	messages.Put(m)
}

// Size is the encoded size of the message.
func (m *Message) Size() int {
	n := 0
	for _, p := range m.Parts {
		n += len(p)
	}
	return n
}

// SotWResponse assembles a DiscoveryResponse from resources' encoded Any
// fields.
func SotWResponse(version uint64, typeURL, nonce string, rs []*Resource) *Message {
	fields := make([][]byte, len(rs))
	for i, r := range rs {
		fields[i] = r.Any
	}
	return SotWFields(version, typeURL, nonce, fields)
}

// SotWFields assembles a DiscoveryResponse from encoded resources fields
// (Resource.Any, Resource.SotWWrapped, Heartbeat.SotW).
func SotWFields(version uint64, typeURL, nonce string, fields [][]byte) *Message {
	m, h := newMessage(len(fields))
	h = protowire.AppendTag(h, sotwVersion, protowire.BytesType)
	h = appendDecimal(h, version)
	h = protowire.AppendTag(h, sotwTypeURL, protowire.BytesType)
	h = protowire.AppendString(h, typeURL)
	h = protowire.AppendTag(h, sotwNonce, protowire.BytesType)
	h = protowire.AppendString(h, nonce)
	m.Parts = append(append(m.Parts, h), fields...)
	return m
}

// SotWFullState assembles a DiscoveryResponse from a body of concatenated
// Any fields built once for many clients (cache.State.SotW).
func SotWFullState(version uint64, typeURL, nonce string, body []byte) *Message {
	return SotWFields(version, typeURL, nonce, [][]byte{body})
}

// DeltaResponse assembles a DeltaDiscoveryResponse from resources' encoded
// Resource fields and the names of removed resources.
func DeltaResponse(version uint64, typeURL, nonce string, rs []*Resource, removed []string) *Message {
	fields := make([][]byte, len(rs))
	for i, r := range rs {
		fields[i] = r.Wire
	}
	return DeltaFields(version, typeURL, nonce, fields, removed)
}

// The SotW and delta assemblers have one shape on purpose: the two
// response messages differ in their fields' numbers and in removed
// resources, and each assembler writes its own message's header.

// DeltaFields assembles a DeltaDiscoveryResponse from encoded resources
// fields (Resource.Wire, Resource.WireNoTTL, Heartbeat.Wire) and the names
// of removed resources.
func DeltaFields(version uint64, typeURL, nonce string, fields [][]byte, removed []string) *Message {
	m, h := newMessage(len(fields))
	h = protowire.AppendTag(h, deltaVersion, protowire.BytesType)
	h = appendDecimal(h, version)
	h = protowire.AppendTag(h, deltaTypeURL, protowire.BytesType)
	h = protowire.AppendString(h, typeURL)
	h = protowire.AppendTag(h, deltaNonce, protowire.BytesType)
	h = protowire.AppendString(h, nonce)
	for _, n := range removed {
		h = protowire.AppendTag(h, deltaRemoved, protowire.BytesType)
		h = protowire.AppendString(h, n)
	}
	m.Parts = append(append(m.Parts, h), fields...)
	return m
}

// appendDecimal appends v in decimal as a length-delimited field's value,
// as AppendString(strconv.FormatUint(v, 10)) would, without the string.
func appendDecimal(b []byte, v uint64) []byte {
	var d [20]byte
	return protowire.AppendBytes(b, strconv.AppendUint(d[:0], v, 10))
}

// DecodeAny decodes r's resource, as clients get it: the Any its SotW
// encoding carries (the resources field of a DiscoveryResponse), for
// people (the admin endpoint's bodies). The resource's bytes are not
// changed.
func DecodeAny(r *Resource) (*anypb.Any, error) {
	var m discoverypb.DiscoveryResponse
	if err := proto.Unmarshal(r.Any, &m); err != nil {
		return nil, fmt.Errorf("decode %q: %w", r.Name, err)
	}
	if len(m.GetResources()) != 1 {
		return nil, fmt.Errorf("decode %q: %d resources, want 1", r.Name, len(m.GetResources()))
	}
	return m.GetResources()[0], nil
}
