package xds

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"

	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
)

var (
	resTTL = field(&discoverypb.Resource{}, "ttl")

	anyTypeURL = field(&anypb.Any{}, "type_url")
	anyValue   = field(&anypb.Any{}, "value")

	durationSeconds = field(&durationpb.Duration{}, "seconds")
	durationNanos   = field(&durationpb.Duration{}, "nanos")
)

func init() {
	// ReceivedResource builds a Resource field by field in this order, as
	// proto.Marshal does (by number), and its SotW Any as a slice of it.
	if !(resVersion < resResource && resResource < resName && resName < resAliases && resAliases < resTTL) ||
		resResource != sotwResources {
		panic("xds: the Resource fields are not in the order ReceivedResource builds them")
	}
}

// ReceivedResource is a resource of a Received response. Name, Version,
// TypeURL and Heartbeat are what the relay checks before encoding it.
type ReceivedResource struct {
	Name, Version string
	TypeURL       string // of the resource's Any
	// Heartbeat is set when the resource is not: the TTL is refreshed
	// ("TTL").
	Heartbeat bool

	// The resource as received: its delta resources field, and slices of
	// it. If the Any or the TTL is not as proto.Marshal writes it, the
	// resource is decoded instead, into pb, and encoded as before.
	field    []byte // tag, length, Resource
	exact    bool   // field is what Encode gives, if Version is set
	anyField []byte // the Resource's resource field (tag, length, Any)
	anyMsg   []byte // the Any
	value    []byte // the Any's value
	aliases  []string
	ttl      *durationpb.Duration // nil if none
	ttlMsg   []byte
	pb       *discoverypb.Resource

	bytesVersion string // BytesVersion's, once computed
}

// newReceivedResource reads a resources field that validateBytesField
// accepted.
func newReceivedResource(field []byte) (ReceivedResource, error) {
	r := ReceivedResource{field: field}
	if r.parse() {
		return r, nil
	}
	pb := new(discoverypb.Resource)
	if err := proto.Unmarshal(fieldBody(field), pb); err != nil {
		return ReceivedResource{}, err
	}
	return ReceivedResource{Name: pb.GetName(), Version: pb.GetVersion(), TypeURL: pb.GetResource().GetTypeUrl(),
		Heartbeat: pb.GetResource() == nil, pb: pb}, nil
}

// fieldBody is the value of a length-delimited field.
func fieldBody(field []byte) []byte {
	_, _, n := protowire.ConsumeTag(field)
	v, _ := protowire.ConsumeBytes(field[n:])
	return v
}

// parse reads the fields Encode uses, as proto.Unmarshal would (the last
// of a name or version counts, aliases add up; the others are dropped),
// and notes whether the field is exactly what Encode gives: those fields
// only, each once, in order, minimally encoded, none set to its zero
// value. False if the Any or the TTL is not as proto.Marshal writes it, or
// is sent twice (proto.Unmarshal merges those).
func (r *ReceivedResource) parse() bool {
	body := fieldBody(r.field)
	start := len(r.field) - len(body)
	exact, last, hasAny, hasTTL := true, protowire.Number(0), false, false
	for b := body; len(b) > 0; {
		num, typ, n := protowire.ConsumeTag(b)
		at := start + len(body) - len(b)
		b = b[n:]
		if typ != protowire.BytesType || !encoded(num) {
			exact = false
			b = b[protowire.ConsumeFieldValue(num, typ, b):]
			continue
		}
		v, m := protowire.ConsumeBytes(b)
		b = b[m:]
		exact = exact && n == protowire.SizeTag(num) && m == protowire.SizeBytes(len(v)) &&
			(num > last || num == resAliases && last == resAliases)
		last = num
		switch num {
		case resVersion:
			r.Version, exact = string(v), exact && len(v) > 0
		case resName:
			r.Name, exact = string(v), exact && len(v) > 0
		case resAliases:
			r.aliases = append(r.aliases, string(v))
		case resResource:
			typeURL, value, ok := canonicalAny(v)
			if !ok || hasAny {
				return false
			}
			r.TypeURL, r.value, r.anyMsg, r.anyField, hasAny = typeURL, value, v, r.field[at:at+n+m:at+n+m], true
		case resTTL:
			d, ok := canonicalDuration(v)
			if !ok || hasTTL {
				return false
			}
			r.ttl, r.ttlMsg, hasTTL = d, v, true
		}
	}
	r.exact, r.Heartbeat = exact, !hasAny
	return true
}

// encoded reports whether Encode writes field num of a Resource.
func encoded(num protowire.Number) bool {
	return num == resVersion || num == resResource || num == resName || num == resAliases || num == resTTL
}

// canonicalAny reads an Any written as proto.Marshal writes it: type URL
// then value, each only if set, and nothing else.
func canonicalAny(b []byte) (typeURL string, value []byte, ok bool) {
	tu, b, ok := canonicalBytes(b, anyTypeURL)
	if !ok {
		return "", nil, false
	}
	value, b, ok = canonicalBytes(b, anyValue)
	return string(tu), value, ok && len(b) == 0
}

// canonicalDuration reads a Duration written as proto.Marshal writes it.
func canonicalDuration(b []byte) (*durationpb.Duration, bool) {
	s, b, ok := canonicalVarint(b, durationSeconds)
	if !ok {
		return nil, false
	}
	n, b, ok := canonicalVarint(b, durationNanos)
	if !ok || len(b) > 0 || n != uint64(int64(int32(n))) {
		return nil, false
	}
	return &durationpb.Duration{Seconds: int64(s), Nanos: int32(n)}, true
}

// canonicalBytes reads field num of b if b starts with it, as proto.Marshal
// writes a set string or bytes field; nil if b does not start with it.
func canonicalBytes(b []byte, num protowire.Number) (v, rest []byte, ok bool) {
	rest, has := canonicalTag(b, num, protowire.BytesType)
	if !has {
		return nil, b, true
	}
	v, n := protowire.ConsumeBytes(rest)
	if n < 0 || n != protowire.SizeBytes(len(v)) || len(v) == 0 {
		return nil, nil, false
	}
	return v, rest[n:], true
}

// canonicalVarint reads field num of b if b starts with it, as
// proto.Marshal writes a set integer field; 0 if b does not start with it.
func canonicalVarint(b []byte, num protowire.Number) (v uint64, rest []byte, ok bool) {
	rest, has := canonicalTag(b, num, protowire.VarintType)
	if !has {
		return 0, b, true
	}
	v, n := protowire.ConsumeVarint(rest)
	if n < 0 || n != protowire.SizeVarint(v) || v == 0 {
		return 0, nil, false
	}
	return v, rest[n:], true
}

// canonicalTag consumes the tag of num, minimally encoded, if b starts
// with it.
func canonicalTag(b []byte, num protowire.Number, typ protowire.Type) ([]byte, bool) {
	v, n := protowire.ConsumeVarint(b)
	if n < 0 || v != protowire.EncodeTag(num, typ) || n != protowire.SizeTag(num) {
		return b, false
	}
	return b[n:], true
}

// Encode is Encode(name, version, resource, ttl, aliases) of the received
// resource, the same bytes, built from the received ones: a resource
// received as Encode would write it (a version, no TTL, no other field) is
// its own encoding, with no copy.
func (r *ReceivedResource) Encode() (*Resource, error) {
	if r.pb != nil {
		return Encode(r.pb.GetName(), r.pb.GetVersion(), r.pb.GetResource(), r.pb.GetTtl(), r.pb.GetAliases())
	}
	if r.Name == "" {
		return nil, errNoName(r.TypeURL)
	}
	if err := validateValue(r.TypeURL, r.value); err != nil {
		return nil, errUndecodable(r.Name, r.TypeURL, err)
	}
	out := &Resource{Name: r.Name, Version: r.Version, Aliases: r.aliases, Warm: Warm(r.TypeURL, r.value),
		Refs: Refs(r.TypeURL, r.value)}
	if out.Version == "" {
		out.Version = r.BytesVersion()
	}
	out.Wire, out.Any = r.field, r.anyField
	if !r.exact || r.Version == "" {
		out.Wire, out.Any = r.build(out.Version, r.ttl != nil)
	}
	if r.ttl != nil && r.ttl.AsDuration() > 0 {
		out.TTL = r.ttl.AsDuration()
		out.WireNoTTL, _ = r.build(out.Version, false)
		out.SotWWrapped = wrapSotW(fieldBody(out.Wire))
	}
	return out, nil
}

// BytesVersion is the version Encode gives a resource received without
// one: a hash of its Any's bytes, the same for the same bytes whatever
// response, stream or server they came in. "" if the resource was
// decoded (not as proto.Marshal writes it): Encode is then needed to
// know it.
func (r *ReceivedResource) BytesVersion() string {
	if r.pb != nil || r.anyMsg == nil {
		return ""
	}
	if r.bytesVersion == "" {
		r.bytesVersion = AnyVersion(r.anyMsg)
	}
	return r.bytesVersion
}

// AnyVersion is the version of an encoded google.protobuf.Any received
// without one (BytesVersion): what a relay below that speaks SotW to this
// one calls a resource this one sent it.
func AnyVersion(anyMsg []byte) string {
	sum := sha256.Sum256(anyMsg)
	return hex.EncodeToString(sum[:8])
}

// BytesVersion is the version a relay gives the resource's bytes when they
// arrive without one (ReceivedResource.BytesVersion), as they do over
// SotW: the version a relay below that speaks SotW to this one holds the
// resource at, whatever its version here. It hashes the bytes each time.
func (r *Resource) BytesVersion() string {
	return AnyVersion(fieldBody(r.Any))
}

// HasTTL reports whether the resource carries a TTL ("TTL"): sent again,
// it refreshes the TTL even with the same bytes.
func (r *ReceivedResource) HasTTL() bool {
	return r.ttl != nil || r.pb.GetTtl() != nil
}

// build encodes the resource as a delta resources field, with its TTL if
// withTTL, and returns with it its SotW resources field, a slice of it.
func (r *ReceivedResource) build(version string, withTTL bool) (wire, sotw []byte) {
	str := func(n protowire.Number, s string) int { return protowire.SizeTag(n) + protowire.SizeBytes(len(s)) }
	body := str(resVersion, version) + protowire.SizeTag(resResource) + protowire.SizeBytes(len(r.anyMsg)) + str(resName, r.Name)
	for _, al := range r.aliases {
		body += str(resAliases, al)
	}
	if withTTL {
		body += protowire.SizeTag(resTTL) + protowire.SizeBytes(len(r.ttlMsg))
	}
	wire = make([]byte, 0, protowire.SizeTag(deltaResources)+protowire.SizeBytes(body))
	wire = protowire.AppendVarint(protowire.AppendTag(wire, deltaResources, protowire.BytesType), uint64(body))
	wire = protowire.AppendString(protowire.AppendTag(wire, resVersion, protowire.BytesType), version)
	start := len(wire)
	wire = protowire.AppendBytes(protowire.AppendTag(wire, resResource, protowire.BytesType), r.anyMsg)
	sotw = wire[start:len(wire):len(wire)]
	wire = protowire.AppendString(protowire.AppendTag(wire, resName, protowire.BytesType), r.Name)
	for _, al := range r.aliases {
		wire = protowire.AppendString(protowire.AppendTag(wire, resAliases, protowire.BytesType), al)
	}
	if withTTL {
		wire = protowire.AppendBytes(protowire.AppendTag(wire, resTTL, protowire.BytesType), r.ttlMsg)
	}
	return wire, sotw
}

// EncodeHeartbeat is EncodeHeartbeat(name, version, ttl) of the received
// resource.
func (r *ReceivedResource) EncodeHeartbeat() (*Heartbeat, error) {
	if r.pb != nil {
		return EncodeHeartbeat(r.pb.GetName(), r.pb.GetVersion(), r.pb.GetTtl())
	}
	return EncodeHeartbeat(r.Name, r.Version, r.ttl)
}

// validateValue is validate of an Any's type URL and value.
func validateValue(typeURL string, value []byte) error {
	mt, err := protoregistry.GlobalTypes.FindMessageByURL(typeURL)
	if err != nil {
		return err
	}
	return validateMessage(value, mt.Descriptor(), 0)
}

func errNoName(typeURL string) error {
	return fmt.Errorf("resource of type %s has no name", typeURL)
}

func errUndecodable(name, typeURL string, err error) error {
	return fmt.Errorf("resource %q: cannot decode %s: %w", name, typeURL, err)
}
