package upstream

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc/codes"

	"github.com/xdsrelay/xdsrelay/cache"
)

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

func cluster(name, timeout string) string {
	return `"@type": type.googleapis.com/envoy.config.cluster.v3.Cluster
name: ` + name + `
connect_timeout: ` + timeout + "\n"
}

func waitVersion(t *testing.T, c *cache.Cache, name string, not string) string {
	t.Helper()
	var version string
	eventually(t, name+" to get a version other than "+strconv.Quote(not), func() bool {
		l := c.Get(resourcev3.ClusterType, []string{name})[0]
		if l.Resource == nil || l.Resource.Version == not {
			return false
		}
		version = l.Resource.Version
		return true
	})
	return version
}

// The file source serves what a group wants, says what does not exist,
// follows changes to the files, and keeps serving the last good files when a
// change does not load.
func TestFileSource(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "a.yaml"), cluster("a", "1s"))
	writeFile(t, filepath.Join(dir, "notes.txt"), "not a resource")
	f, err := NewFile(dir, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := serveFiles(t, f, "a", "missing")
	v1 := waitVersion(t, c, "a", "")
	missing := c.Get(resourcev3.ClusterType, []string{"missing"})[0]
	if !missing.Absent || missing.Error == nil || missing.Error.Code != int32(codes.NotFound) {
		t.Errorf("missing: %+v, want absent with NOT_FOUND", missing)
	}
	writeFile(t, filepath.Join(dir, "a.yaml"), cluster("a", "2s"))
	v2 := waitVersion(t, c, "a", v1)
	// A reload does not make the error anew: clients are not sent it again.
	if l := c.Get(resourcev3.ClusterType, []string{"missing"})[0]; l.Error != missing.Error {
		t.Errorf("after a reload, missing's error is %+v, want the first one kept", l.Error)
	}

	// A broken change is ignored; a later good one is served.
	writeFile(t, filepath.Join(dir, "a.yaml"), "\"@type\": type.googleapis.com/envoy.config.cluster.v3.Cluster\nname: a\nconnect_timeout: [\n")
	eventually(t, "the broken change to be seen", func() bool {
		return strings.Contains(f.Status().Invalid, "resource files do not load")
	})
	if l := c.Get(resourcev3.ClusterType, []string{"a"})[0]; l.Resource == nil || l.Resource.Version != v2 {
		t.Fatalf("after a broken change: %+v, want version %s kept", l.Resource, v2)
	}
	writeFile(t, filepath.Join(dir, "a.yaml"), cluster("a", "3s"))
	waitVersion(t, c, "a", v2)
}

func TestFileSourceErrorsNameTheFile(t *testing.T) {
	for name, content := range map[string]string{
		"unknown type":   "\"@type\": type.googleapis.com/google.protobuf.Duration\nvalue: 1s\n",
		"bad field":      "\"@type\": type.googleapis.com/envoy.config.cluster.v3.Cluster\nnmae: x\n",
		"no name":        "\"@type\": type.googleapis.com/envoy.config.cluster.v3.Cluster\nconnect_timeout: 1s\n",
		"not yaml":       "{{{",
		"duplicate name": cluster("x", "1s") + "---\n" + cluster("x", "2s"),
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			writeFile(t, filepath.Join(dir, "broken.yaml"), content)
			_, err := NewFile(dir, nil, nil)
			if err == nil || !strings.Contains(err.Error(), "broken.yaml") {
				t.Fatalf("error %v, want one naming broken.yaml", err)
			}
		})
	}
	if _, err := NewFile(filepath.Join(t.TempDir(), "nope"), nil, nil); err == nil {
		t.Fatal("a missing directory loaded")
	}
}

// A file written after NewFile's load and before Run watches the directory
// is served once Run starts, with no later change to wake the watch.
func TestFileSourceReadsWhatChangedBeforeRun(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "a.yaml"), cluster("a", "1s"))
	f, err := NewFile(dir, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "b.yaml"), cluster("b", "1s"))

	c := serveFiles(t, f, "a", "b")
	waitVersion(t, c, "a", "")
	waitVersion(t, c, "b", "")
}

// Run's first read of the files says nothing when nothing changed since
// NewFile's; a change is logged once.
func TestFileSourceStartsQuietly(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "a.yaml"), cluster("a", "1s"))
	log := &syncBuffer{}
	f, err := NewFile(dir, slog.New(slog.NewJSONHandler(log, nil)), nil)
	if err != nil {
		t.Fatal(err)
	}
	loaded := f.Status().LastResponse
	c := serveFiles(t, f, "a")
	v1 := waitVersion(t, c, "a", "")
	eventually(t, "Run's first read of the files", func() bool { return f.Status().LastResponse.After(loaded) })
	if n := len(log.Lines(t, "resource files reloaded")); n != 0 {
		t.Errorf("%d reload lines when nothing changed, want none", n)
	}
	writeFile(t, filepath.Join(dir, "a.yaml"), cluster("a", "2s"))
	waitVersion(t, c, "a", v1)
	if n := len(log.Lines(t, "resource files reloaded")); n != 1 {
		t.Errorf("%d reload lines after one change, want one", n)
	}
}

// serveFiles runs f into a new cache, watched for names of clusters, until
// the test ends.
func serveFiles(t *testing.T, f *File, names ...string) *cache.Cache {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	c := cache.New(cache.Options{Retention: time.Minute})
	c.Watch(cache.NewWatch(), resourcev3.ClusterType, names...)
	done := make(chan struct{}, 2)
	go func() { f.Run(ctx); done <- struct{}{} }()
	go func() { f.Serve(ctx, c); done <- struct{}{} }()
	t.Cleanup(func() {
		cancel()
		for range 2 {
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Error("the file source's Run or Serve did not end with its context")
				return
			}
		}
	})
	return c
}

// countedInterest is a cache's interest whose whole reads are counted.
type countedInterest struct {
	*cache.Cache
	whole atomic.Int32
}

func (c *countedInterest) Interest() map[string]cache.Interest {
	c.whole.Add(1)
	return c.Cache.Interest()
}

// A file feed reads the group's whole interest when the files change, and
// only what entered it when the interest changes (docs/architecture.md,
// invariant 2): a client subscribing one name after another costs one
// name each, however many the group holds.
func TestFileFeedReadsWhatEnteredTheInterest(t *testing.T) {
	dir := t.TempDir()
	var files strings.Builder
	for i := range 20 {
		files.WriteString("---\n" + cluster(fmt.Sprint("c", i), "1s"))
	}
	writeFile(t, filepath.Join(dir, "clusters.yaml"), files.String())
	f, err := NewFile(dir, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := cache.New(cache.Options{Retention: time.Minute})
	in := &countedInterest{Cache: c}
	feed, err := f.Feed(Group{ID: "g", Cache: c, Interest: in})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); feed.Run(ctx) }()
	defer func() { cancel(); <-done }()
	w := cache.NewWatch()
	for i := range 20 {
		name := fmt.Sprint("c", i)
		c.Watch(w, resourcev3.ClusterType, name, "missing-"+name)
		eventually(t, name+" to be served", func() bool {
			l := c.Get(resourcev3.ClusterType, []string{name, "missing-" + name})
			return l[0].Resource != nil && l[1].Absent
		})
	}
	if n := in.whole.Load(); n != 1 {
		t.Errorf("the whole interest was read %d times for 20 subscriptions, want once (at the start)", n)
	}
}

// An error the JSON decoder places is placed in the file as written: the
// line and column of the YAML key or value, in a list of resources, in a
// later document, with anchors and merge keys (which load as yaml merges
// them), and in a JSON file.
func TestFileErrorsPlacedInTheFile(t *testing.T) {
	for _, tc := range []struct {
		name, file, content, want string
	}{
		{"third line", "c.yaml", "\"@type\": type.googleapis.com/envoy.config.cluster.v3.Cluster\nname: x\nconect_timeout: 1s\n",
			`c.yaml: resource 1: line 3:1: unknown field "conect_timeout"`},
		{"a list's second", "l.yaml", "- \"@type\": type.googleapis.com/envoy.config.cluster.v3.Cluster\n  name: x\n" +
			"- \"@type\": type.googleapis.com/envoy.config.cluster.v3.Cluster\n  name: y\n  connect_timeout: soon\n",
			`l.yaml: resource 2: line 5:20: invalid google.protobuf.Duration value "soon"`},
		{"a later document", "d.yaml", cluster("x", "1s") + "---\n" + "\"@type\": type.googleapis.com/envoy.config.cluster.v3.Cluster\nname: y\n  \nlb_policy: FASTEST\n",
			`d.yaml: resource 2: line 8:12: invalid value for enum field lbPolicy: "FASTEST"`},
		{"a merge key", "m.yaml", "- &base\n  \"@type\": type.googleapis.com/envoy.config.cluster.v3.Cluster\n  name: a\n  connect_timeout: 1s\n" +
			"- <<: *base\n  name: b\n  type: BOGUS\n",
			`m.yaml: resource 2: line 7:9: invalid value for enum field type: "BOGUS"`},
		{"json", "j.json", "{\n  \"@type\": \"type.googleapis.com/envoy.config.cluster.v3.Cluster\",\n  \"name\": \"x\",\n  \"nmae\": \"y\"\n}\n",
			`j.json: resource 1: line 4:3: unknown field "nmae"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			writeFile(t, filepath.Join(dir, tc.file), tc.content)
			_, err := NewFile(dir, nil, nil)
			if err == nil || !strings.HasSuffix(err.Error(), tc.want) {
				t.Errorf("error %v, want it to end %s", err, tc.want)
			}
		})
	}
}

// A merge key loads as yaml merges it: the map's own keys first.
func TestFileMergeKeys(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "m.yaml"), "- &base\n  \"@type\": type.googleapis.com/envoy.config.cluster.v3.Cluster\n  name: a\n  connect_timeout: 1s\n"+
		"- <<: *base\n  name: b\n")
	f, err := NewFile(dir, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if n := f.Count(); n != 2 {
		t.Errorf("%d resources, want a and b", n)
	}
}

// CheckDir says what is wrong with every file and every invalid resource,
// and counts the others' resources.
func TestCheckDirReportsEveryError(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "good.yaml"), cluster("good", "1s"))
	writeFile(t, filepath.Join(dir, "a.yaml"), "{{{")
	writeFile(t, filepath.Join(dir, "b.yaml"), "\"@type\": type.googleapis.com/envoy.config.cluster.v3.Cluster\nnmae: x\n")
	writeFile(t, filepath.Join(dir, "c.yaml"), cluster("bad", "-1s"))
	n, errs := CheckDir(dir)
	if n != 1 || len(errs) != 3 {
		t.Fatalf("%d resources, errors %v; want 1 and 3", n, errs)
	}
	for i, file := range []string{"a.yaml", "b.yaml", "c.yaml"} {
		if !strings.Contains(errs[i].Error(), file) {
			t.Errorf("error %d: %v, want %s", i, errs[i], file)
		}
	}
}

// Every error of one file is said, each with its resource's number and
// its place in the file: a value its proto's rules refuse, a resource
// with no name, one without "@type", a second definition of a name; the
// file's good resource still counts.
func TestCheckDirReportsEveryErrorOfAFile(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "all.yaml"), cluster("a", "1s")+"---\n"+
		cluster("neg", "-1s")+"---\n"+
		"\"@type\": type.googleapis.com/envoy.config.cluster.v3.Cluster\nconnect_timeout: 1s\n---\n"+
		"name: typeless\n---\n"+
		cluster("a", "2s"))
	n, errs := CheckDir(dir)
	var lines []string
	for _, err := range errs {
		lines = append(lines, err.Error())
	}
	all := strings.Join(lines, "\n")
	for _, want := range []string{`resource 3: resource of type type.googleapis.com/envoy.config.cluster.v3.Cluster has no name`,
		`resource 4: line 1`, `missing "@type"`, `resource 5: Cluster "a" is also defined in`, `Cluster "neg"`, "ConnectTimeout"} {
		if !strings.Contains(all, want) {
			t.Errorf("the errors do not say %q:\n%s", want, all)
		}
	}
	if n != 1 || len(errs) != 4 {
		t.Errorf("%d resources, %d errors; want 1 (a) and 4:\n%s", n, len(errs), all)
	}
}

// A YAML syntax error is placed on the line it is on (yaml.v3 gives a
// parser's error the line before, counted from 0), with its resource's
// number in a file of documents.
func TestFileYAMLErrorsPlaced(t *testing.T) {
	for _, tc := range []struct {
		name, content, want string
	}{
		{"a key expected", cluster("a", "1s") + "---\n\"@type\": type.googleapis.com/envoy.config.cluster.v3.Cluster\nname: b\n- oops\n",
			"resource 2: yaml: line 7: did not find expected key"},
		{"an open list", cluster("a", "1s") + "---\n\"@type\": type.googleapis.com/envoy.config.cluster.v3.Cluster\nname: b\ndns_lookup_family: [x, y\n",
			"resource 2: yaml: line 7: did not find expected ',' or ']'"},
		{"a scanner's error", "\"@type\": type.googleapis.com/envoy.config.cluster.v3.Cluster\nname: b\n  x: y\n",
			"resource 1: yaml: line 3: mapping values are not allowed in this context"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			writeFile(t, filepath.Join(dir, "f.yaml"), tc.content)
			_, errs := CheckDir(dir)
			if len(errs) != 1 || !strings.HasSuffix(errs[0].Error(), tc.want) {
				t.Errorf("errors %v, want one ending %q", errs, tc.want)
			}
		})
	}
}
