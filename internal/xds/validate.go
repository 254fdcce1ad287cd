package xds

import (
	"errors"
	"fmt"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
)

// maxDepth is how deeply messages may nest, as in proto.Unmarshal.
const maxDepth = 10000

var (
	errDepth = errors.New("exceeded maximum recursion depth")
	errUTF8  = errors.New("string field contains invalid UTF-8")
	// errFieldNumber is a tag whose field number is out of range.
	errFieldNumber = errors.New("invalid field number")
)

// validate reports whether a decodes as its type, accepting and rejecting
// exactly what proto.Unmarshal does (malformed tags, lengths and varints,
// truncated fields, invalid UTF-8 in proto3 strings, nesting beyond the
// limit; a known field of the wrong wire type is kept as unknown, not an
// error; xDS protos have no groups, which are checked as unknown fields),
// without building the message: for a 200-endpoint
// ClusterLoadAssignment it is several times cheaper than decoding it and
// allocates nothing.
func validate(a *anypb.Any) error {
	return validateValue(a.GetTypeUrl(), a.GetValue())
}

func validateMessage(b []byte, md protoreflect.MessageDescriptor, depth int) error {
	if depth > maxDepth {
		return errDepth
	}
	fields := md.Fields()
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		if num > protowire.MaxValidNumber {
			return errFieldNumber // ConsumeTag takes these; proto.Unmarshal does not
		}
		b = b[n:]
		fd := fields.ByNumber(num)
		if typ == protowire.BytesType && fd != nil {
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			b = b[n:]
			if err := validateBytesField(v, fd, depth); err != nil {
				return fmt.Errorf("%s: %w", fd.FullName(), err)
			}
			continue
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
	}
	return nil
}

// validateBytesField checks a length-delimited value of field fd.
func validateBytesField(v []byte, fd protoreflect.FieldDescriptor, depth int) error {
	switch fd.Kind() {
	case protoreflect.MessageKind:
		return validateMessage(v, fd.Message(), depth+1)
	case protoreflect.StringKind:
		if enforceUTF8(fd) && !utf8.Valid(v) {
			return errUTF8
		}
	case protoreflect.BytesKind:
	default:
		if !fd.IsList() {
			return nil // a scalar sent length-delimited: kept as unknown
		}
		return validatePacked(v, fd.Kind())
	}
	return nil
}

// validatePacked checks a packed repeated scalar.
func validatePacked(v []byte, k protoreflect.Kind) error {
	for len(v) > 0 {
		var n int
		switch k {
		case protoreflect.Fixed32Kind, protoreflect.Sfixed32Kind, protoreflect.FloatKind:
			_, n = protowire.ConsumeFixed32(v)
		case protoreflect.Fixed64Kind, protoreflect.Sfixed64Kind, protoreflect.DoubleKind:
			_, n = protowire.ConsumeFixed64(v)
		default:
			_, n = protowire.ConsumeVarint(v)
		}
		if n < 0 {
			return protowire.ParseError(n)
		}
		v = v[n:]
	}
	return nil
}

// enforceUTF8 reports whether proto.Unmarshal rejects invalid UTF-8 in
// string field fd: in proto3 files (every xDS proto) it does.
func enforceUTF8(fd protoreflect.FieldDescriptor) bool {
	return fd.ParentFile().Syntax() == protoreflect.Proto3
}
