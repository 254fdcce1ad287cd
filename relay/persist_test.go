package relay

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
	"unsafe"

	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/xdsrelay/xdsrelay/cache"
	"github.com/xdsrelay/xdsrelay/internal/metrics"
	"github.com/xdsrelay/xdsrelay/internal/testcp"
)

// Warm restart: a relay restarted while the control plane is down configures
// its clients from cache.persist_dir; files that do not load are reported and
// ignored; when the control plane returns the clients converge.
func TestWarmRestart(t *testing.T) { forEachDialect(t, testWarmRestart) }

// testWarmRestart is TestWarmRestart in front of a control plane that
// speaks dialect: in state of the world the saved versions are the bytes' own,
// so the control plane's full state on its return changes nothing but y.
func testWarmRestart(t *testing.T, dialect testcp.Dialect) {
	dir := t.TempDir()
	persist := func(c *Config) {
		c.Cache.PersistDir = dir
		c.Cache.PersistInterval = 20 * time.Millisecond
		fastReconnect(c)
	}
	cp := testcp.StartDialect(t, dialect)
	cp.Set(t, "c1", "1", testcp.Cluster("x"), testcp.Cluster("y"), testcp.Endpoints("a", "10.0.0.1:80"))

	first := startRelay(t, cp.Addr, persist)
	s := openDelta(t, first.Addr())
	s.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n", "c1"), TypeUrl: resourcev3.ClusterType})
	s.send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNamesSubscribe: []string{"a"}})
	if got := collectDelta(s, 3); !slices.Equal(got, []string{"a", "x", "y"}) {
		t.Fatalf("before the restart: %v", got)
	}
	s.close()
	shutdown(t, first)
	cp.Stop()

	// Garbage and a damaged copy beside the real file.
	files, _ := filepath.Glob(filepath.Join(dir, "group-*.cache"))
	if len(files) != 1 {
		t.Fatalf("%d cache files written, want 1", len(files))
	}
	good, _ := os.ReadFile(files[0])
	damaged := slices.Clone(good)
	damaged[len(damaged)/2] ^= 0xff
	os.WriteFile(filepath.Join(dir, "group-0000000000000000.cache"), damaged, 0o600)
	os.WriteFile(filepath.Join(dir, "group-1111111111111111.cache"), []byte("hello"), 0o600)

	second := startRelay(t, cp.Addr, persist)
	if n := len(second.snapshotGroups()); n != 1 {
		t.Fatalf("%d groups restored, want 1 (the damaged files ignored)", n)
	}
	d := openDelta(t, second.Addr())
	d.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n2", "c1"), TypeUrl: resourcev3.ClusterType})
	if got := deltaNames(d.recv()); !slices.Equal(got, []string{"x", "y"}) {
		t.Fatalf("from the saved cache: %v", got)
	}
	o := openSotW(t, second.Addr())
	o.send(&discoverypb.DiscoveryRequest{Node: node("n3", "c1"), TypeUrl: resourcev3.EndpointType, ResourceNames: []string{"a"}})
	if n := len(o.recv().GetResources()); n != 1 {
		t.Fatalf("EDS from the saved cache: %d resources", n)
	}

	// The control plane returns without y.
	cp.Set(t, "c1", "2", testcp.Cluster("x"), testcp.Endpoints("a", "10.0.0.1:80"))
	cp.Restart()
	if resp := d.recv(); !slices.Equal(resp.GetRemovedResources(), []string{"y"}) || len(resp.GetResources()) != 0 {
		t.Fatalf("after the control plane returned: sent %v removed %v", deltaNames(resp), resp.GetRemovedResources())
	}
}

// sealed is a cache file holding body after the magic line, with a valid
// checksum: what a damaged or hostile file that still checks out looks like.
func sealed(body []byte) []byte {
	data := append([]byte(persistMagic), body...)
	sum := sha256.Sum256(data)
	return append(data, sum[:]...)
}

// hugeLength is a record that claims 2^62 bytes, with a valid checksum.
func hugeLength() []byte {
	return sealed(append(binary.AppendUvarint(nil, 1<<62), "tiny"...))
}

// A saved cache file cannot hurt the relay: one claiming a 2^62-byte record
// (with a valid checksum) and one over cache.persist_max_bytes (refused
// unread) are reported in the log, on /readyz and in
// xdsrelay_persist_errors_total, and ignored; the relay serves.
func TestPersistHostileFiles(t *testing.T) {
	dir := t.TempDir()
	huge := filepath.Join(dir, "group-0000000000000000.cache")
	if err := os.WriteFile(huge, hugeLength(), 0o600); err != nil {
		t.Fatal(err)
	}
	const max = 64 << 10
	big := filepath.Join(dir, "group-1111111111111111.cache")
	f, err := os.Create(big)
	if err != nil {
		t.Fatal(err)
	}
	// Sparse: its size is all there is to it.
	if err := f.Truncate(max + 1); err != nil {
		t.Fatal(err)
	}
	f.Close()
	cp := testcp.Start(t)
	cp.Set(t, "c1", "1", testcp.Cluster("x"))
	r := startRelay(t, cp.Addr, func(c *Config) {
		c.Cache.PersistDir = dir
		c.Cache.PersistMaxBytes = max
	})
	if n := len(r.snapshotGroups()); n != 0 {
		t.Fatalf("%d groups restored from hostile files", n)
	}
	ready := readyz(t, r)
	for _, want := range []string{
		"group-0000000000000000.cache: node: a record of 4611686018427387904 bytes where 4 remain",
		"group-1111111111111111.cache: 65537 bytes, over cache.persist_max_bytes (65536); not read",
	} {
		if !strings.Contains(ready, want) {
			t.Errorf("/readyz does not say %q:\n%s", want, ready)
		}
	}
	if got, want := r.readySummary(), "ready; 2 saved caches did not load"; got != want {
		t.Errorf("/readyz in general terms: %q, want %q", got, want)
	}
	if m := getMetrics(t, r); !strings.Contains(m, `xdsrelay_persist_errors_total{op="load"} 2`) {
		t.Errorf("/metrics does not count 2 load errors:\n%s", m)
	}
	s := openDelta(t, r.Addr())
	s.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n", "c1"), TypeUrl: resourcev3.ClusterType})
	if got := deltaNames(s.recv()); !slices.Equal(got, []string{"x"}) {
		t.Fatalf("served %v", got)
	}
}

// A cache that cannot be saved (cache.persist_dir replaced by a file) is
// counted in xdsrelay_persist_errors_total{op="save"} and reported on
// /readyz until a later round of saves succeeds.
func TestPersistSaveFailureReported(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "persist")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	cp := testcp.Start(t)
	cp.Set(t, "c1", "1", testcp.Cluster("x"))
	r := startRelay(t, cp.Addr, func(c *Config) {
		c.Cache.PersistDir = dir
		c.Cache.PersistInterval = 20 * time.Millisecond
	})
	// Root ignores permissions, so a file stands where the directory was.
	if err := os.Remove(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	s := openDelta(t, r.Addr())
	s.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n", "c1"), TypeUrl: resourcev3.ClusterType})
	s.recv()
	eventually(t, "the save failure on /readyz", func() bool {
		return strings.Contains(readyz(t, r), `cache.persist_dir: saving is failing`)
	})
	if ready := readyz(t, r); !strings.Contains(ready, fmt.Sprintf("group %q", keyOf("c1"))) || !strings.Contains(ready, "not a directory") {
		t.Errorf("/readyz does not name the group and the error:\n%s", ready)
	}
	if m := getMetrics(t, r); strings.Contains(m, `xdsrelay_persist_errors_total{op="save"} 0`) {
		t.Errorf("/metrics does not count the save errors:\n%s", m)
	}

	if err := os.Remove(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the cache saved", func() bool {
		files, _ := filepath.Glob(filepath.Join(dir, "group-*.cache"))
		return len(files) == 1 && !strings.Contains(readyz(t, r), "saving")
	})
}

// What a saved cache file may not be: each is refused with a reason, and
// none panics or allocates from the length it claims.
func TestDecodeGroupRefuses(t *testing.T) {
	valid, err := encodeGroup(node("n", "c1"), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	nodeRecord := valid[len(persistMagic) : len(valid)-sha256.Size]
	record := func(m *discoverypb.DeltaDiscoveryResponse) []byte {
		b, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return append(binary.AppendUvarint(nil, uint64(len(b))), b...)
	}
	file := func(records ...[]byte) []byte {
		return sealed(slices.Concat(append([][]byte{nodeRecord}, records...)...))
	}
	eds, err := anypb.New(testcp.Endpoints("a"))
	if err != nil {
		t.Fatal(err)
	}
	clusters := &discoverypb.DeltaDiscoveryResponse{TypeUrl: resourcev3.ClusterType, RemovedResources: []string{"x"}}
	for _, tc := range []struct {
		name string
		data []byte
		want string
	}{
		{name: "not a cache file", data: []byte("hello"), want: "not an xdsrelay cache file"},
		{name: "truncated", data: valid[:len(valid)-1], want: "checksum mismatch"},
		{name: "2^62-byte record", data: hugeLength(), want: "node: a record of 4611686018427387904 bytes where 4 remain"},
		{name: "length overflows", data: sealed([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}), want: "node: malformed record length"},
		{name: "record past the end", data: sealed(append(slices.Clone(nodeRecord), 5, 1)), want: "record 1: a record of 5 bytes where 1 remain"},
		{name: "not a proto", data: file([]byte{3, 0xff, 0xff, 0xff}), want: "record 1: proto"},
		{name: "unknown type", data: file(record(&discoverypb.DeltaDiscoveryResponse{TypeUrl: "example.com/T"})), want: `record 1: unknown type "example.com/T"`},
		{name: "type twice", data: file(record(clusters), record(clusters)), want: "saved twice"},
		{name: "resource of another type", data: file(record(&discoverypb.DeltaDiscoveryResponse{TypeUrl: resourcev3.ClusterType,
			Resources: []*discoverypb.Resource{{Name: "a", Version: "1", Resource: eds}}})), want: `record 1: resource "a" of type`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := decodeGroup(tc.data)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// /readyz names at most maxLoadFailures files that did not load, and counts
// the others.
func TestPersistHealthBoundsWhatItNames(t *testing.T) {
	h := newPersistHealth(&metrics.Registry{})
	for i := range maxLoadFailures + 2 {
		h.loadFailure(fmt.Sprintf("group-%d.cache", i), errors.New("truncated"))
	}
	d := h.detail()
	if len(d) != maxLoadFailures+1 || d[maxLoadFailures] != "cache.persist_dir: 2 more saved caches did not load (see the log)" {
		t.Errorf("detail: %q", d)
	}
	if s := h.summary(); !slices.Equal(s, []string{"12 saved caches did not load"}) {
		t.Errorf("summary: %q", s)
	}
	if got := h.loadErrors.Get(); got != maxLoadFailures+2 {
		t.Errorf("counted %d load errors", got)
	}
}

// A saved cache keeps each resource's upstream version (the response's
// version_info or system_version_info it came in), shared by neighbours
// as it was; a file saved without them (as before they were kept) loads,
// each with none.
func TestPersistUpstreamVersions(t *testing.T) {
	enc := func(name, ver string) *cache.Resource { return encodeForTest(t, name, ver, testcp.Cluster(name)) }
	a, b, c := enc("a", "1"), enc("b", "2"), enc("c", "3")
	a.Upstream, b.Upstream = "snap-7", "snap-7"
	states := []cache.TypeState{{TypeURL: resourcev3.ClusterType, Resources: []*cache.Resource{a, b, c}}}
	data, err := encodeGroup(node("n", "c1"), states, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, got, err := decodeGroup(data)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || len(got[0].Resources) != 3 {
		t.Fatalf("decoded %+v", got)
	}
	var ups []string
	for _, r := range got[0].Resources {
		ups = append(ups, r.Upstream)
	}
	if !slices.Equal(ups, []string{"snap-7", "snap-7", ""}) || unsafe.StringData(ups[0]) != unsafe.StringData(ups[1]) {
		t.Fatalf("upstream versions %q, want snap-7 (one string), snap-7, none", ups)
	}

	// As a file written before upstream versions were kept: the same
	// record without them.
	a.Upstream, b.Upstream = "", ""
	old, err := encodeGroup(node("n", "c1"), states, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(old) >= len(data) {
		t.Fatalf("a cache without upstream versions is %d bytes, with them %d", len(old), len(data))
	}
	_, got, err = decodeGroup(old)
	if err != nil || len(got) != 1 || len(got[0].Resources) != 3 {
		t.Fatalf("decoded %+v, %v", got, err)
	}
	for _, r := range got[0].Resources {
		if r.Upstream != "" || r.Version == "" {
			t.Errorf("%s: version %q, upstream version %q", r.Name, r.Version, r.Upstream)
		}
	}
}

// A relay killed while it saved leaves the temporary file it was writing
// (writeAtomic renames it only once it is whole). The next start removes
// such files, and only those, logs which, and restores the caches they
// were to replace.
func TestLeftoverTemporaryFilesRemovedAtStart(t *testing.T) {
	dir := t.TempDir()
	persist := func(c *Config) {
		c.Cache.PersistDir = dir
		c.Cache.PersistInterval = 20 * time.Millisecond
	}
	cp := testcp.Start(t)
	cp.Set(t, "c1", "1", testcp.Cluster("x"))
	first := startRelay(t, cp.Addr, persist)
	s := openDelta(t, first.Addr())
	s.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n", "c1"), TypeUrl: resourcev3.ClusterType})
	s.recv()
	s.close()
	shutdown(t, first)

	// What a save cut short leaves: part of a file, under the temporary
	// name; and what is not the relay's to remove.
	saved, _ := filepath.Glob(filepath.Join(dir, "group-*.cache"))
	if len(saved) != 1 {
		t.Fatalf("%d caches saved, want 1", len(saved))
	}
	good, _ := os.ReadFile(saved[0])
	leftovers := []string{".tmp-1849203311", ".tmp-977102"}
	for _, name := range leftovers {
		if err := os.WriteFile(filepath.Join(dir, name), good[:len(good)/2], 0o600); err != nil {
			t.Fatal(err)
		}
	}
	kept := []string{"notes.txt", ".tmp-dir"}
	os.WriteFile(filepath.Join(dir, kept[0]), []byte("the operator's"), 0o600)
	os.Mkdir(filepath.Join(dir, kept[1]), 0o700)

	logs := &logBuffer{}
	second := startRelayLogged(t, cp.Addr, slog.New(slog.NewJSONHandler(logs, nil)), persist)
	for _, name := range leftovers {
		if _, err := os.Stat(filepath.Join(dir, name)); !os.IsNotExist(err) {
			t.Errorf("%s is still there: %v", name, err)
		}
	}
	for _, name := range kept {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			t.Errorf("%s was removed: %v", name, err)
		}
	}
	lines := logs.Lines(t, "cache.persist_dir: removed the temporary files of saves that did not finish (the relay was stopped while saving)")
	if len(lines) != 1 || lines[0]["removed"] != float64(2) || fmt.Sprint(lines[0]["files"]) != fmt.Sprint(leftovers) {
		t.Errorf("log lines %v, want one naming %v", lines, leftovers)
	}
	if n := len(second.snapshotGroups()); n != 1 {
		t.Errorf("%d groups restored beside the leftovers, want 1", n)
	}
}
