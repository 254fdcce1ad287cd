package relay

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/protobuf/proto"

	"github.com/xdsrelay/xdsrelay/cache"
	"github.com/xdsrelay/xdsrelay/internal/xds"
)

// A saved cache is one file per group in cache.persist_dir:
//
//	magic line, then length-prefixed records: the group's node, then one
//	DeltaDiscoveryResponse per type (its resources as sent to delta
//	clients, removed_resources the names known not to exist, and
//	system_version_info the wildcard state), then the SHA-256 of all that.
//
// Files are written whole to a temporary name and renamed, so a crash leaves
// the previous file. A file that does not check out is reported and ignored.
const persistMagic = "xdsrelay-cache v1\n"

const (
	wildcardOff    = ""
	wildcardHeld   = "wildcard"
	wildcardSynced = "wildcard,synced"
)

func persistFile(dir, key string) string {
	sum := sha256.Sum256([]byte(key))
	return filepath.Join(dir, "group-"+hex.EncodeToString(sum[:8])+".cache")
}

// encodeGroup writes a group's node and cache contents.
func encodeGroup(node *corepb.Node, states []cache.TypeState) ([]byte, error) {
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
		flag := wildcardOff
		if ts.Wildcard {
			flag = wildcardHeld
			if ts.Synced {
				flag = wildcardSynced
			}
		}
		msg := xds.DeltaResponse(0, ts.TypeURL, flag, ts.Resources, ts.Absent)
		record(bytes.Join(msg.Parts, nil))
	}
	sum := sha256.Sum256(buf.Bytes())
	buf.Write(sum[:])
	return buf.Bytes(), nil
}

// decodeGroup reads what encodeGroup wrote, re-validating every resource.
func decodeGroup(data []byte) (*corepb.Node, []cache.TypeState, error) {
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
	r := bufio.NewReader(bytes.NewReader(body[len(persistMagic):]))
	next := func() ([]byte, error) {
		n, err := binary.ReadUvarint(r)
		if err != nil {
			return nil, err
		}
		b := make([]byte, n)
		_, err = io.ReadFull(r, b)
		return b, err
	}
	nb, err := next()
	if err != nil {
		return nil, nil, fmt.Errorf("node: %w", err)
	}
	node := &corepb.Node{}
	if err := proto.Unmarshal(nb, node); err != nil {
		return nil, nil, fmt.Errorf("node: %w", err)
	}
	var states []cache.TypeState
	for {
		b, err := next()
		if errors.Is(err, io.EOF) {
			return node, states, nil
		} else if err != nil {
			return nil, nil, err
		}
		ts, err := decodeType(b)
		if err != nil {
			return nil, nil, err
		}
		states = append(states, ts)
	}
}

func decodeType(b []byte) (cache.TypeState, error) {
	m := &discoverypb.DeltaDiscoveryResponse{}
	if err := proto.Unmarshal(b, m); err != nil {
		return cache.TypeState{}, err
	}
	if !xds.Known(m.GetTypeUrl()) {
		return cache.TypeState{}, fmt.Errorf("unknown type %q", m.GetTypeUrl())
	}
	ts := cache.TypeState{
		TypeURL:  m.GetTypeUrl(),
		Wildcard: strings.HasPrefix(m.GetNonce(), wildcardHeld),
		Synced:   m.GetNonce() == wildcardSynced,
		Absent:   m.GetRemovedResources(),
	}
	for _, res := range m.GetResources() {
		r, err := xds.Encode(res.GetName(), res.GetVersion(), res.GetResource(), res.GetTtl(), res.GetAliases())
		if err != nil {
			return cache.TypeState{}, err
		}
		ts.Resources = append(ts.Resources, r)
	}
	return ts, nil
}

// writeAtomic writes data to path through a temporary file and a rename.
func writeAtomic(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tmp-*")
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

// restore loads every saved group; files that do not load are reported and
// left alone.
func (r *Relay) restore() {
	dir := r.cfg.Cache.PersistDir
	paths, err := filepath.Glob(filepath.Join(dir, "group-*.cache"))
	if err != nil {
		r.log.Error("cache.persist_dir", "error", err)
		return
	}
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err == nil {
			var node *corepb.Node
			var states []cache.TypeState
			if node, states, err = decodeGroup(data); err == nil {
				key := GroupKey(node, r.cfg.Upstream.GroupBy)
				if persistFile(dir, key) != p {
					err = fmt.Errorf("written for another group_by (its group is %q here)", key)
				} else {
					if err = r.restoreGroup(key, node, states); err == nil {
						r.log.Info("restored a saved cache", "group", key, "file", p, "types", len(states))
						continue
					}
				}
			}
		}
		r.log.Warn("ignoring a saved cache that does not load", "file", p, "error", err)
	}
}

// restoreGroup starts a saved group: its clients are served from the saved
// cache until the control plane answers, and its upstream resumes with the
// saved versions.
func (r *Relay) restoreGroup(key string, node *corepb.Node, states []cache.TypeState) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, err := r.startGroupLocked(key, node, states)
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
		r.writeCaches(written)
		if stopping {
			return
		}
	}
}

func (r *Relay) writeCaches(written map[string]uint64) {
	seen := map[string]bool{}
	for _, g := range r.snapshotGroups() {
		seen[g.key] = true
		states, gen := g.cache.Export()
		if gen == written[g.key] {
			continue
		}
		data, err := encodeGroup(g.node, states)
		if err == nil {
			err = writeAtomic(persistFile(r.cfg.Cache.PersistDir, g.key), data)
		}
		if err != nil {
			r.log.Error("writing the cache to cache.persist_dir", "group", g.key, "error", err)
			continue
		}
		written[g.key] = gen
	}
	for key := range written {
		if !seen[key] {
			// The group ended: its file would only restore expired state.
			os.Remove(persistFile(r.cfg.Cache.PersistDir, key))
			delete(written, key)
		}
	}
}
