package xds

import (
	"errors"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// MarshalJSON is m as protojson for people (watch, /debug/cache bodies):
// an Any of a type this binary does not link (a control plane's own
// extension) is printed raw, its type URL and its bytes in base64
// ({"@type": URL, "value": BASE64}), rather than failing the whole message.
// m is not changed.
func MarshalJSON(m proto.Message) ([]byte, error) {
	return marshalJSON(m, protojson.MarshalOptions{})
}

// MarshalEnvoyJSON is MarshalJSON with the protos' own field names
// (version_info, dynamic_active_clusters), as Envoy's admin endpoint
// writes its /config_dump, so that what reads Envoy's reads it.
func MarshalEnvoyJSON(m proto.Message) ([]byte, error) {
	return marshalJSON(m, protojson.MarshalOptions{UseProtoNames: true})
}

func marshalJSON(m proto.Message, opts protojson.MarshalOptions) ([]byte, error) {
	m = proto.Clone(m)
	if err := rawUnknownAnys(m.ProtoReflect()); err != nil {
		return nil, err
	}
	opts.Resolver = rawResolver{}
	return opts.Marshal(m)
}

// rawResolver resolves the linked types, and any other type URL as a
// BytesValue: what rawUnknownAnys made of such an Any's value.
type rawResolver struct{}

func (rawResolver) FindMessageByURL(url string) (protoreflect.MessageType, error) {
	mt, err := protoregistry.GlobalTypes.FindMessageByURL(url)
	if errors.Is(err, protoregistry.NotFound) {
		return (&wrapperspb.BytesValue{}).ProtoReflect().Type(), nil
	}
	return mt, err
}

func (rawResolver) FindMessageByName(name protoreflect.FullName) (protoreflect.MessageType, error) {
	return protoregistry.GlobalTypes.FindMessageByName(name)
}

func (rawResolver) FindExtensionByName(name protoreflect.FullName) (protoreflect.ExtensionType, error) {
	return protoregistry.GlobalTypes.FindExtensionByName(name)
}

func (rawResolver) FindExtensionByNumber(m protoreflect.FullName, n protoreflect.FieldNumber) (protoreflect.ExtensionType, error) {
	return protoregistry.GlobalTypes.FindExtensionByNumber(m, n)
}

// rawUnknownAnys wraps the value of every Any in m, at any depth, whose
// type is not linked as a BytesValue's; the Anys of linked types are
// decoded, walked and encoded again.
func rawUnknownAnys(m protoreflect.Message) error {
	if a, ok := m.Interface().(*anypb.Any); ok {
		return rawAny(a)
	}
	var err error
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsList() && fd.Message() != nil:
			l := v.List()
			for i := 0; i < l.Len() && err == nil; i++ {
				err = rawUnknownAnys(l.Get(i).Message())
			}
		case fd.IsMap() && fd.MapValue().Message() != nil:
			v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
				err = rawUnknownAnys(mv.Message())
				return err == nil
			})
		case !fd.IsList() && !fd.IsMap() && fd.Message() != nil:
			err = rawUnknownAnys(v.Message())
		}
		return err == nil
	})
	return err
}

func rawAny(a *anypb.Any) error {
	if a.GetTypeUrl() == "" {
		return nil
	}
	mt, err := protoregistry.GlobalTypes.FindMessageByURL(a.GetTypeUrl())
	if errors.Is(err, protoregistry.NotFound) {
		a.Value = protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), a.GetValue())
		return nil
	}
	if err != nil {
		return err
	}
	inner := mt.New()
	if err := proto.Unmarshal(a.GetValue(), inner.Interface()); err != nil {
		return err
	}
	if err := rawUnknownAnys(inner); err != nil {
		return err
	}
	a.Value, err = proto.MarshalOptions{Deterministic: true}.Marshal(inner.Interface())
	return err
}
