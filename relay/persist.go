package relay

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/xdsrelay/xdsrelay/cache"
	"github.com/xdsrelay/xdsrelay/internal/lockorder"
	"github.com/xdsrelay/xdsrelay/internal/metrics"
	"github.com/xdsrelay/xdsrelay/internal/xds"
	"github.com/xdsrelay/xdsrelay/upstream"
)

// A saved cache is one file per group in cache.persist_dir:
//
//	magic line, then length-prefixed records: the group's node, then one
//	DeltaDiscoveryResponse per type (its resources as sent to delta
//	clients, removed_resources the names known not to exist, the nonce
//	the wildcard state, and in field 1000 each resource's upstream
//	version), then the SHA-256 of all that.
//
// Files are written whole to a temporary name and renamed, so a crash leaves
// the previous file (and the temporary one, which the next start removes:
// removeLeftovers). A file that does not check out is reported and ignored.
const persistMagic = "xdsrelay-cache v1\n"

const (
	wildcardOff    = ""
	wildcardHeld   = "wildcard"
	wildcardSynced = "wildcard,synced"
)

// PersistFilePattern matches the names of the saved caches in
// cache.persist_dir, one file a group.
const PersistFilePattern = "group-*.cache"

func persistFile(dir, key string) string {
	sum := sha256.Sum256([]byte(key))
	return filepath.Join(dir, "group-"+hex.EncodeToString(sum[:8])+".cache")
}

// savedKeyField is the field of a saved cache's node record that holds the
// group's key, so that persist inspect names the group as the relay did
// (GroupID) whatever upstream.group_by is. Node has no such field: a file
// written before it loads without the key, and a binary from before it
// ignores it.
const savedKeyField = 1000

// savedUpstreamIDField is the field of a saved cache's node record that
// holds the node id the group presented upstream (upstream.node.id
// expanded), for persist inspect: the record's own fields are the group's
// (its group_by fields), which a restart presents anew from its
// configuration.
const savedUpstreamIDField = 1001

// withKey is node with the group's key in savedKeyField and the node id it
// presented upstream in savedUpstreamIDField, for encodeGroup.
func withKey(node *corepb.Node, key, upstreamID string) *corepb.Node {
	n := proto.Clone(node).(*corepb.Node)
	u := protowire.AppendTag(nil, savedKeyField, protowire.BytesType)
	u = protowire.AppendString(u, key)
	u = protowire.AppendTag(u, savedUpstreamIDField, protowire.BytesType)
	n.ProtoReflect().SetUnknown(protowire.AppendString(u, upstreamID))
	return n
}

// SavedKey is the group key a saved cache's node holds (see withKey); ""
// for a file written before it did.
func SavedKey(node *corepb.Node) string { return savedString(node, savedKeyField) }

// SavedUpstreamID is the node id the group presented upstream when its
// cache was saved (see withKey); "" for a file written before it was kept.
func SavedUpstreamID(node *corepb.Node) string { return savedString(node, savedUpstreamIDField) }

// savedString is the string in field num of node's unknown fields; "" if
// it has none.
func savedString(node *corepb.Node, field protowire.Number) string {
	b := node.ProtoReflect().GetUnknown()
	for len(b) > 0 {
		num, typ, l := protowire.ConsumeTag(b)
		if l < 0 {
			return ""
		}
		b = b[l:]
		if num == field && typ == protowire.BytesType {
			v, m := protowire.ConsumeString(b)
			if m < 0 {
				return ""
			}
			return v
		}
		m := protowire.ConsumeFieldValue(num, typ, b)
		if m < 0 {
			return ""
		}
		b = b[m:]
	}
	return ""
}

// encodeGroup writes a group's node and cache contents. owner names the
// upstream of each name (nil: the default's, for all): a type served by
// several upstreams is written as one record per upstream, each but the
// default's naming its upstream in control_plane.identifier.
func encodeGroup(node *corepb.Node, states []cache.TypeState, owner func(typeURL, name string) string) ([]byte, error) {
	var buf bytes.Buffer
	buf.WriteString(persistMagic)
	record := func(b []byte) {
		buf.Write(binary.AppendUvarint(nil, uint64(len(b))))
		buf.Write(b)
	}
	nb, err := proto.Marshal(node)
	if err != nil {
		return nil, err
	}
	record(nb)
	for _, ts := range states {
		for _, part := range splitByOwner(ts, owner) {
			flag := wildcardOff
			if part.Wildcard {
				flag = wildcardHeld
				if part.Synced {
					flag = wildcardSynced
				}
			}
			msg := xds.DeltaResponse(0, part.TypeURL, flag, part.Resources, part.Absent)
			if part.upstream != upstream.DefaultUpstream {
				msg.Parts[0] = appendControlPlane(msg.Parts[0], part.upstream)
			}
			record(appendUpstreamVersions(bytes.Join(msg.Parts, nil), part.Resources))
		}
	}
	sum := sha256.Sum256(buf.Bytes())
	buf.Write(sum[:])
	return buf.Bytes(), nil
}

// savedType is one record of a saved cache: a type's contents from one
// upstream.
type savedType struct {
	cache.TypeState
	upstream string
}

// splitByOwner splits a type's contents by the upstream serving each name;
// the wildcard goes with the type's own upstream.
func splitByOwner(ts cache.TypeState, owner func(typeURL, name string) string) []savedType {
	if owner == nil {
		return []savedType{{TypeState: ts, upstream: upstream.DefaultUpstream}}
	}
	parts := map[string]*savedType{}
	part := func(up string) *savedType {
		p := parts[up]
		if p == nil {
			p = &savedType{TypeState: cache.TypeState{TypeURL: ts.TypeURL}, upstream: up}
			parts[up] = p
		}
		return p
	}
	if ts.Wildcard {
		p := part(owner(ts.TypeURL, "*"))
		p.Wildcard, p.Synced = true, ts.Synced
	}
	for _, r := range ts.Resources {
		p := part(owner(ts.TypeURL, r.Name))
		p.Resources = append(p.Resources, r)
	}
	for _, n := range ts.Absent {
		p := part(owner(ts.TypeURL, n))
		p.Absent = append(p.Absent, n)
	}
	out := make([]savedType, 0, len(parts))
	for _, up := range slices.Sorted(maps.Keys(parts)) {
		out = append(out, *parts[up])
	}
	return out
}

// appendControlPlane adds control_plane.identifier to an encoded
// DeltaDiscoveryResponse: the upstream the record's resources came from.
func appendControlPlane(b []byte, identifier string) []byte {
	cp := protowire.AppendTag(nil, 1, protowire.BytesType) // ControlPlane.identifier
	cp = protowire.AppendString(cp, identifier)
	b = protowire.AppendTag(b, 7, protowire.BytesType) // DeltaDiscoveryResponse.control_plane
	return protowire.AppendBytes(b, cp)
}

// savedUpstreamField is the field of a saved type's record that holds its
// resources' upstream versions (Resource.Upstream), one string per resource
// in the record's order. DeltaDiscoveryResponse has no such field: a file
// written before it loads with none, and a binary from before it ignores
// it.
const savedUpstreamField = 1000

// appendUpstreamVersions adds the resources' upstream versions to an
// encoded record; nothing if none has one.
func appendUpstreamVersions(b []byte, rs []*cache.Resource) []byte {
	if !slices.ContainsFunc(rs, func(r *cache.Resource) bool { return r.Upstream != "" }) {
		return b
	}
	for _, r := range rs {
		b = protowire.AppendTag(b, savedUpstreamField, protowire.BytesType)
		b = protowire.AppendString(b, r.Upstream)
	}
	return b
}

// upstreamVersions reads what appendUpstreamVersions wrote among a
// record's unknown fields: nil if there is none, or it does not name one
// per resource. Equal neighbours share one string, as a response's
// resources did.
func upstreamVersions(unknown []byte, n int) []string {
	var out []string
	for len(unknown) > 0 {
		num, typ, l := protowire.ConsumeTag(unknown)
		if l < 0 {
			return nil
		}
		unknown = unknown[l:]
		if num == savedUpstreamField && typ == protowire.BytesType {
			v, m := protowire.ConsumeString(unknown)
			if m < 0 {
				return nil
			}
			if len(out) > 0 && out[len(out)-1] == v {
				v = out[len(out)-1]
			}
			out, unknown = append(out, v), unknown[m:]
			continue
		}
		if m := protowire.ConsumeFieldValue(num, typ, unknown); m >= 0 {
			unknown = unknown[m:]
		} else {
			return nil
		}
	}
	if len(out) != n {
		return nil
	}
	return out
}

// decodeGroup reads what encodeGroup wrote, re-validating every resource,
// with each type's records merged.
func decodeGroup(data []byte) (*corepb.Node, []cache.TypeState, error) {
	node, saved, err := decodeRecords(data)
	if err != nil {
		return nil, nil, err
	}
	return node, mergeTypes(saved), nil
}

// mergeTypes joins the records of each type, in type order.
func mergeTypes(saved []savedType) []cache.TypeState {
	byType := map[string]*cache.TypeState{}
	for _, st := range saved {
		ts := byType[st.TypeURL]
		if ts == nil {
			ts = &cache.TypeState{TypeURL: st.TypeURL}
			byType[st.TypeURL] = ts
		}
		ts.Wildcard, ts.Synced = ts.Wildcard || st.Wildcard, ts.Synced || st.Synced
		ts.Resources = append(ts.Resources, st.Resources...)
		ts.Absent = append(ts.Absent, st.Absent...)
	}
	out := make([]cache.TypeState, 0, len(byType))
	for _, t := range slices.Sorted(maps.Keys(byType)) {
		ts := byType[t]
		slices.SortFunc(ts.Resources, func(a, b *cache.Resource) int { return strings.Compare(a.Name, b.Name) })
		slices.Sort(ts.Absent)
		out = append(out, *ts)
	}
	return out
}

// decodeRecords reads what encodeGroup wrote, record by record. Nothing is
// allocated from a length the file gives before it is checked against the
// bytes that remain. A record without control_plane is the default
// upstream's (as every record of a file written before several upstreams).
func decodeRecords(data []byte) (*corepb.Node, []savedType, error) {
	if !bytes.HasPrefix(data, []byte(persistMagic)) {
		return nil, nil, errors.New("not an xdsrelay cache file")
	}
	if len(data) < len(persistMagic)+sha256.Size {
		return nil, nil, errors.New("truncated")
	}
	body, sum := data[:len(data)-sha256.Size], data[len(data)-sha256.Size:]
	if got := sha256.Sum256(body); !bytes.Equal(got[:], sum) {
		return nil, nil, errors.New("checksum mismatch (corrupt or truncated)")
	}
	rest := body[len(persistMagic):]
	nb, rest, err := nextRecord(rest)
	if err != nil {
		return nil, nil, fmt.Errorf("node: %w", err)
	}
	node := &corepb.Node{}
	if err := proto.Unmarshal(nb, node); err != nil {
		return nil, nil, fmt.Errorf("node: %w", err)
	}
	var saved []savedType
	for len(rest) > 0 {
		var b []byte
		if b, rest, err = nextRecord(rest); err != nil {
			return nil, nil, fmt.Errorf("record %d: %w", len(saved)+1, err)
		}
		st, err := decodeType(b)
		if err != nil {
			return nil, nil, fmt.Errorf("record %d: %w", len(saved)+1, err)
		}
		saved = append(saved, st)
	}
	if err := checkStates(saved); err != nil {
		return nil, nil, err
	}
	return node, saved, nil
}

// InspectPersistFile reads a saved cache file (one of cache.persist_dir's
// group-*.cache files) without restoring it: the group's node and its cache
// by type. It checks the file as a restore does, under the default
// cache.persist_max_bytes.
func InspectPersistFile(path string) (*corepb.Node, []cache.TypeState, error) {
	data, err := readPersistFile(path, Default().Cache.PersistMaxBytes)
	if err != nil {
		return nil, nil, fmt.Errorf("relay: %s: %w", path, err)
	}
	node, states, err := decodeGroup(data)
	if err != nil {
		return nil, nil, fmt.Errorf("relay: %s: %w", path, err)
	}
	return node, states, nil
}

// nextRecord splits the length-prefixed record at the start of b from what
// follows it.
func nextRecord(b []byte) (record, rest []byte, err error) {
	n, k := binary.Uvarint(b)
	if k <= 0 {
		return nil, nil, errors.New("malformed record length")
	}
	b = b[k:]
	if n > uint64(len(b)) {
		return nil, nil, fmt.Errorf("a record of %d bytes where %d remain", n, len(b))
	}
	return b[:n], b[n:], nil
}

func decodeType(b []byte) (savedType, error) {
	m := &discoverypb.DeltaDiscoveryResponse{}
	if err := proto.Unmarshal(b, m); err != nil {
		return savedType{}, err
	}
	if !xds.Known(m.GetTypeUrl()) {
		return savedType{}, fmt.Errorf("unknown type %q", m.GetTypeUrl())
	}
	up := m.GetControlPlane().GetIdentifier()
	if up == "" {
		up = upstream.DefaultUpstream
	}
	ts := cache.TypeState{
		TypeURL:  m.GetTypeUrl(),
		Wildcard: strings.HasPrefix(m.GetNonce(), wildcardHeld),
		Synced:   m.GetNonce() == wildcardSynced,
		Absent:   m.GetRemovedResources(),
	}
	ups := upstreamVersions(m.ProtoReflect().GetUnknown(), len(m.GetResources()))
	for i, res := range m.GetResources() {
		if got := res.GetResource().GetTypeUrl(); got != ts.TypeURL {
			return savedType{}, fmt.Errorf("resource %q of type %q among the %s resources", res.GetName(), got, ts.TypeURL)
		}
		r, err := xds.Encode(res.GetName(), res.GetVersion(), res.GetResource(), res.GetTtl(), res.GetAliases())
		if err != nil {
			return savedType{}, err
		}
		if ups != nil {
			r.Upstream = ups[i]
		}
		ts.Resources = append(ts.Resources, r)
	}
	return savedType{TypeState: ts, upstream: up}, nil
}

// checkStates refuses what encodeGroup never writes: a type twice from
// one upstream, or a name twice within a type (as a resource or as known
// not to exist, in one record or two).
func checkStates(saved []savedType) error {
	records := make(map[[2]string]bool, len(saved))
	names := map[string]map[string]bool{}
	for _, st := range saved {
		key := [2]string{st.TypeURL, st.upstream}
		if records[key] {
			return fmt.Errorf("type %s saved twice for upstream %q", st.TypeURL, st.upstream)
		}
		records[key] = true
		seen := names[st.TypeURL]
		if seen == nil {
			seen = map[string]bool{}
			names[st.TypeURL] = seen
		}
		for _, n := range slices.Concat(savedNames(st.Resources), st.Absent) {
			if seen[n] {
				return fmt.Errorf("%s %q saved twice", st.TypeURL, n)
			}
			seen[n] = true
		}
	}
	return nil
}

func savedNames(rs []*cache.Resource) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = r.Name
	}
	return out
}

// readPersistFile reads a saved cache of at most max bytes. The size is
// checked before anything is read, and the read stops past max in case the
// file grew meanwhile.
func readPersistFile(path string, max int) ([]byte, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, errors.New("not a regular file")
	}
	if st.Size() > int64(max) {
		return nil, fmt.Errorf("%d bytes, over cache.persist_max_bytes (%d); not read", st.Size(), max)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, int64(max)+1))
	if err != nil {
		return nil, err
	}
	if len(data) > max {
		return nil, fmt.Errorf("over cache.persist_max_bytes (%d) when read", max)
	}
	return data, nil
}

// tmpPattern matches the temporary files writeAtomic writes and renames:
// one is left behind only by a relay killed while it saved.
const tmpPattern = ".tmp-*"

// writeAtomic writes data to path through a temporary file and a rename.
func writeAtomic(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), tmpPattern)
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// persistHealth is what went wrong reading and writing cache.persist_dir,
// for the log, /readyz and the metrics.
type persistHealth struct {
	// Read-only after newPersistHealth.
	loadErrors, saveErrors *metrics.Value

	mu         lockorder.Mutex[persistHealthMu]
	loadFailed []string // guarded by mu: "file: why", the first maxLoadFailures of the restore
	loadFails  int      // guarded by mu: files that did not load
	saveFailed string   // guarded by mu: the last failure of the current run of them
	saveFails  int      // guarded by mu: failures since the last round without one
}

// maxLoadFailures bounds the files /readyz names; the log names them all.
const maxLoadFailures = 10

func newPersistHealth(reg *metrics.Registry) *persistHealth {
	errs := reg.Counter("xdsrelay_persist_errors_total", "Saved caches in cache.persist_dir that did not load (op=load), and failures to save one (op=save).", "op")
	return &persistHealth{loadErrors: errs.With("load"), saveErrors: errs.With("save")}
}

func (h *persistHealth) loadFailure(file string, err error) {
	h.loadErrors.Inc()
	h.mu.Lock()
	defer h.mu.Unlock()
	h.loadFails++
	if len(h.loadFailed) < maxLoadFailures {
		h.loadFailed = append(h.loadFailed, file+": "+err.Error())
	}
}

// saved records a round of saves: failed is its last failure, "" if none.
func (h *persistHealth) saved(fails int, failed string) {
	h.saveErrors.Add(int64(fails))
	h.mu.Lock()
	defer h.mu.Unlock()
	if fails == 0 {
		h.saveFails, h.saveFailed = 0, ""
		return
	}
	h.saveFails += fails
	h.saveFailed = failed
}

// detail describes the problems for a private admin listener: file names,
// group keys and the errors.
func (h *persistHealth) detail() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for _, f := range h.loadFailed {
		out = append(out, "cache.persist_dir: a saved cache did not load and was ignored: "+f)
	}
	if more := h.loadFails - len(h.loadFailed); more > 0 {
		out = append(out, fmt.Sprintf("cache.persist_dir: %d more saved caches did not load (see the log)", more))
	}
	if h.saveFails > 0 {
		out = append(out, fmt.Sprintf("cache.persist_dir: saving is failing (%d failures since the last good round): %s", h.saveFails, h.saveFailed))
	}
	return out
}

// summary describes the problems in general terms, for a public listener.
func (h *persistHealth) summary() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	if n := h.loadFails; n > 0 {
		out = append(out, fmt.Sprintf("%d saved %s did not load", n, plural(n, "cache", "caches")))
	}
	if h.saveFails > 0 {
		out = append(out, "saving caches is failing")
	}
	return out
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// restore loads every saved group; files that do not load are reported and
// left alone. First it removes what saves the relay did not finish left
// behind.
func (r *Relay) restore() {
	dir := r.cfg.Cache.PersistDir
	r.removeLeftovers(dir)
	paths, err := filepath.Glob(filepath.Join(dir, PersistFilePattern))
	if err != nil {
		r.log.Error("cache.persist_dir", "error", err)
		return
	}
	for _, p := range paths {
		if err := r.restoreFile(p); err != nil {
			r.log.Warn("ignoring a saved cache that does not load", "file", p, "error", err)
			r.persistHealth.loadFailure(p, err)
		}
	}
}

// maxLeftoversNamed bounds the files the log names when leftovers are
// removed; it counts them all.
const maxLeftoversNamed = 10

// removeLeftovers removes the temporary files that a relay killed while
// saving left in dir (writeAtomic renames each once it is whole, so one
// found at start is of a save that never finished: the cache it was to
// replace is still there), and logs which. It runs before the persister
// starts: none is this relay's own. Only regular files are removed.
func (r *Relay) removeLeftovers(dir string) {
	paths, err := filepath.Glob(filepath.Join(dir, tmpPattern))
	if err != nil {
		return
	}
	var removed []string
	for _, p := range paths {
		if st, err := os.Lstat(p); err != nil || !st.Mode().IsRegular() {
			continue
		}
		if err := os.Remove(p); err != nil {
			r.log.Warn("cache.persist_dir: could not remove a temporary file of a save that did not finish", "file", p, "error", err)
			continue
		}
		removed = append(removed, filepath.Base(p))
	}
	if len(removed) == 0 {
		return
	}
	r.log.Info("cache.persist_dir: removed the temporary files of saves that did not finish (the relay was stopped while saving)",
		"dir", dir, "removed", len(removed), "files", removed[:min(len(removed), maxLeftoversNamed)])
}

// restoreFile starts the group saved in path.
func (r *Relay) restoreFile(path string) error {
	data, err := readPersistFile(path, r.cfg.Cache.PersistMaxBytes)
	if err != nil {
		return err
	}
	node, saved, err := decodeRecords(data)
	if err != nil {
		return err
	}
	states := mergeTypes(r.keepRouted(saved, path))
	node.ProtoReflect().SetUnknown(nil) // the saved key (withKey): the node's fields give it
	key := GroupKey(node, r.cfg.Upstream.GroupBy)
	if persistFile(r.cfg.Cache.PersistDir, key) != path {
		return fmt.Errorf("written for another group_by (its group is %s here)", GroupID(key))
	}
	if err := r.restoreGroup(key, node, states); err != nil {
		return err
	}
	r.restored.Store(true)
	r.log.Info("restored a saved cache", "group", GroupID(key), "file", path, "types", len(states))
	return nil
}

// restoreGroup starts a saved group: its clients are served from the saved
// cache until the control plane answers, and its upstream resumes with the
// saved versions.
func (r *Relay) restoreGroup(key string, node *corepb.Node, states []cache.TypeState) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, err := r.startGroupLocked(key, node, states, false)
	return err
}

// persist writes the caches that changed since they were last written,
// every interval, and once more when the relay stops.
func (r *Relay) persist(every time.Duration) {
	written := map[string]uint64{}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		stopping := false
		select {
		case <-t.C:
		case <-r.ctx.Done():
			stopping = true
		}
		s := r.writeCaches(written)
		if stopping {
			// What a restart will find, and where: the last thing shutdown
			// does with the caches.
			r.log.Info("caches saved for the next start", "dir", r.cfg.Cache.PersistDir, "groups", s.saved+s.unchanged,
				"resources", s.resources, "written_now", s.saved, "failed", s.failed)
			return
		}
	}
}

// saveCount is what one writeCaches did.
type saveCount struct {
	saved, unchanged, failed int // groups
	resources                int // in the groups saved or unchanged
}

// writeCaches saves the groups whose caches changed since written; one that
// fails is tried again next time.
func (r *Relay) writeCaches(written map[string]uint64) saveCount {
	var s saveCount
	seen := map[string]bool{}
	fails, last := 0, ""
	for _, g := range r.snapshotGroups() {
		seen[g.key] = true
		states, gen := g.cache.Export()
		if gen == written[g.key] {
			s.unchanged++
			s.resources += g.cache.Len()
			continue
		}
		if err := r.writeCache(g, states); err != nil {
			r.log.Error("writing the cache to cache.persist_dir", "group", g.id, "error", err)
			fails, last = fails+1, fmt.Sprintf("group %s: %v", g.id, err)
			continue
		}
		written[g.key] = gen
		s.saved++
		for _, ts := range states {
			s.resources += len(ts.Resources)
		}
	}
	s.failed = fails
	r.persistHealth.saved(fails, last)
	for key := range written {
		if !seen[key] {
			// The group ended: its file would only restore expired state.
			os.Remove(persistFile(r.cfg.Cache.PersistDir, key))
			delete(written, key)
		}
	}
	return s
}

// writeCache saves one group's cache, unless it is larger than what a
// restore would read.
func (r *Relay) writeCache(g *group, states []cache.TypeState) error {
	data, err := encodeGroup(withKey(g.fields, g.key, g.nodes[0].GetId()), states, r.owner())
	if err != nil {
		return err
	}
	if max := r.cfg.Cache.PersistMaxBytes; len(data) > max {
		return fmt.Errorf("%d bytes, over cache.persist_max_bytes (%d); not saved", len(data), max)
	}
	return writeAtomic(persistFile(r.cfg.Cache.PersistDir, g.key), data)
}

// owner names the upstream serving each name, for the saved caches; nil
// with one upstream.
func (r *Relay) owner() func(typeURL, name string) string {
	if r.routes == nil {
		return nil
	}
	return func(typeURL, name string) string {
		if i := r.routes.Of(typeURL, name); i != upstream.Unroutable {
			return r.routes.Name(i)
		}
		return upstream.DefaultUpstream
	}
}

// keepRouted drops from a saved cache what came from an upstream that does
// not serve it now (the configuration changed since it was saved): a
// resource is only ever served as its own control plane gave it.
func (r *Relay) keepRouted(saved []savedType, path string) []savedType {
	owner := r.owner()
	if owner == nil {
		owner = func(string, string) string { return upstream.DefaultUpstream }
	}
	dropped := 0
	for i := range saved {
		st := &saved[i]
		st.Resources = slices.DeleteFunc(st.Resources, func(res *cache.Resource) bool {
			drop := owner(st.TypeURL, res.Name) != st.upstream
			if drop {
				dropped++
			}
			return drop
		})
		st.Absent = slices.DeleteFunc(st.Absent, func(n string) bool { return owner(st.TypeURL, n) != st.upstream })
		if st.Wildcard && owner(st.TypeURL, "*") != st.upstream {
			st.Wildcard, st.Synced = false, false
		}
	}
	if dropped > 0 {
		r.log.Warn("saved resources now served by another upstream are not restored", "file", path, "resources", dropped)
	}
	return saved
}
