package upstream

import (
	"errors"
	"fmt"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/anypb"
)

// validator is what protoc-gen-validate generates for every xDS message.
type validator interface{ ValidateAll() error }

// anyName is google.protobuf.Any's full name.
var anyName = (&anypb.Any{}).ProtoReflect().Descriptor().FullName()

// validate checks m against the rules its proto declares, and every Any
// nested in it (typed_config, typed_per_filter_config…) whose type is
// registered against its own; an error names the field. Only resources read
// from files are checked: a control plane's stay opaque.
// Spec: "Protoc-Gen-Validate Annotations" (a control plane may validate
// with them to catch problems before any client sees them).
func validate(m proto.Message) error {
	if v, ok := m.(validator); ok {
		if err := v.ValidateAll(); err != nil {
			return err
		}
	}
	return validateAnys(m.ProtoReflect(), "")
}

// validateAnys validates the Anys found anywhere under m; path names m.
func validateAnys(m protoreflect.Message, path string) error {
	var err error
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		err = validateField(fd, v, join(path, string(fd.Name())))
		return err == nil
	})
	return err
}

// validateField validates the Anys under one populated field of a message.
func validateField(fd protoreflect.FieldDescriptor, v protoreflect.Value, path string) error {
	switch {
	case fd.IsMap() && fd.MapValue().Kind() == protoreflect.MessageKind:
		var err error
		v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
			err = validateNested(mv.Message(), fmt.Sprintf("%s[%q]", path, k.String()))
			return err == nil
		})
		return err
	case fd.IsList() && fd.Kind() == protoreflect.MessageKind:
		for i := range v.List().Len() {
			if err := validateNested(v.List().Get(i).Message(), fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
	case !fd.IsMap() && !fd.IsList() && fd.Kind() == protoreflect.MessageKind:
		return validateNested(v.Message(), path)
	}
	return nil
}

// validateNested validates m if it is an Any of a registered type (what it
// holds, then the Anys within), else the Anys under it.
func validateNested(m protoreflect.Message, path string) error {
	if m.Descriptor().FullName() != anyName {
		return validateAnys(m, path)
	}
	a, ok := m.Interface().(*anypb.Any)
	if !ok { // a dynamic Any: not from a file
		return nil
	}
	inner, err := a.UnmarshalNew()
	if errors.Is(err, protoregistry.NotFound) {
		return nil // an extension the relay does not know: passed on as is
	}
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if err := validate(inner); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

func join(path, field string) string {
	if path == "" {
		return field
	}
	return path + "." + field
}
