package xds

import (
	"crypto/sha256"
	"encoding/hex"
	"hash"
)

// StateVersion names a set of resources by their names and versions: two
// sets have the same exactly when they hold the same names at the same
// versions. A REST or Fetch poll answers it as version_info
// (downstream/fetch.go); xdsrelay status shows its first ShortVersionLen
// digits as a client's version of a type, so that the two can be compared.
type StateVersion struct{ h hash.Hash }

// ShortVersionLen is how many hex digits of a StateVersion xdsrelay status
// shows.
const ShortVersionLen = 8

// NewStateVersion starts an empty set.
func NewStateVersion() *StateVersion { return &StateVersion{h: sha256.New()} }

// Add adds a resource; add them in the order of their names.
func (s *StateVersion) Add(name, version string) {
	s.h.Write([]byte(name))
	s.h.Write([]byte{0})
	s.h.Write([]byte(version))
	s.h.Write([]byte{0})
}

// String is the set's version: 24 hex digits.
func (s *StateVersion) String() string { return hex.EncodeToString(s.h.Sum(nil)[:12]) }
