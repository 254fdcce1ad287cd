package xds

import (
	"strings"
	"testing"
)

// A peer's text is cut to MaxText bytes on a character boundary, its full
// length noted.
func TestClip(t *testing.T) {
	long := strings.Repeat("a", MaxText-1) + "é" + strings.Repeat("b", 5000)
	cases := []struct {
		name, in, want string
	}{
		{name: "short", in: "node-1", want: "node-1"},
		{name: "at the bound", in: strings.Repeat("a", MaxText), want: strings.Repeat("a", MaxText)},
		{name: "cut on a character boundary", in: long, want: strings.Repeat("a", MaxText-1) + "…(6025 bytes)"},
	}
	for _, tc := range cases {
		if got := Clip(tc.in); got != tc.want {
			t.Errorf("%s: Clip = %q, want %q", tc.name, got, tc.want)
		}
	}
}
