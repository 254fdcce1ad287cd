package xds

import (
	"strconv"
	"unicode/utf8"
)

// MaxText bounds a text that comes from a peer (a node id, a NACK's error
// message, an upstream error) when the relay logs or forwards it, so that
// one peer cannot write megabytes into a log or a request.
const MaxText = 1024

// Clip returns s cut to MaxText bytes, on a character boundary, with its
// full length noted.
func Clip(s string) string {
	if len(s) <= MaxText {
		return s
	}
	cut := MaxText
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…(" + strconv.Itoa(len(s)) + " bytes)"
}
