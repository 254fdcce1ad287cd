package relay

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"strings"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"

	"github.com/xdsrelay/xdsrelay/internal/metrics"
	"github.com/xdsrelay/xdsrelay/internal/xds"
)

// GroupKey is the key of the group a node belongs to: the values of the
// fields, in order. Nodes with the same key share an upstream stream and a
// cache.
func GroupKey(node *corepb.Node, fields []string) string {
	var b strings.Builder
	for i, f := range fields {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(f)
		b.WriteByte('=')
		b.WriteString(xds.NodeField(node, f))
	}
	return b.String()
}

// Bounds of a group id (GroupID).
const (
	// idPlainMax is the longest key that is its own id.
	idPlainMax = 48
	// idPrefix is how much of a longer key its id keeps.
	idPrefix = 32
	// idHash is how many hex digits of the key's SHA-256 its id ends with.
	idHash = 12
	// IDMax is the longest id: the prefix, '~' and the hash.
	IDMax = idPrefix + 1 + idHash
)

// GroupID is the short name of the group whose key is key, the one name
// the logs, the metrics' group label, the admin endpoint and the commands
// give it: the key itself when it is at most 48 bytes of idSafe
// characters; otherwise the key's first 32 bytes (other characters as
// '_', a trailing comma left out), '~' and the first 12 hex digits of the key's SHA-256 (those the
// name of its saved cache file begins with). It is derived from the key
// alone, so it is the same across restarts and replicas; it is at most
// IDMax bytes of printable ASCII, and holds '~' exactly when it is not the
// key.
func GroupID(key string) string {
	if len(key) <= idPlainMax && strings.IndexFunc(key, func(r rune) bool { return !idSafe(r) }) < 0 {
		return key
	}
	prefix := make([]byte, 0, IDMax)
	for i := 0; i < len(key) && i < idPrefix; i++ {
		if idSafe(rune(key[i])) {
			prefix = append(prefix, key[i])
		} else {
			prefix = append(prefix, '_')
		}
	}
	prefix = bytes.TrimRight(prefix, ",") // cut between two fields
	sum := sha256.Sum256([]byte(key))
	return string(prefix) + "~" + hex.EncodeToString(sum[:])[:idHash]
}

// idSafe reports whether r may appear in a group id as it is: what group
// keys are usually made of, and nothing a shell, a URL or a log line
// would quote.
func idSafe(r rune) bool {
	switch {
	case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
		return true
	}
	return strings.ContainsRune("=,./:_-@+", r)
}

// matchesGroup reports whether name names the group of key: its id, its
// key, or the hashed form the group label had before group ids
// (metrics.Bound), which scripts may still pass.
func matchesGroup(name, key, id string) bool {
	return name == id || name == key || name == metrics.Bound(key)
}
