package xds

import (
	"strings"
	"testing"
	"unsafe"
)

// Canonical gives every copy of a known type URL the one copy in Types, so
// that map keys compare by pointer; an unknown type URL comes back as is.
func TestCanonicalSharesOneCopy(t *testing.T) {
	for _, typeURL := range Types {
		decoded := strings.Clone(typeURL) // as a request's decoded string is
		got := Canonical(decoded)
		if got != typeURL || unsafe.StringData(got) != unsafe.StringData(typeURL) {
			t.Errorf("Canonical(%q) is not the copy in Types", typeURL)
		}
	}
	unknown := "type.googleapis.com/example.Unknown"
	if got := Canonical(unknown); got != unknown {
		t.Errorf("Canonical(%q) = %q", unknown, got)
	}
}
