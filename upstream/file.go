package upstream

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/fsnotify/fsnotify"
	"go.yaml.in/yaml/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/xdsrelay/xdsrelay/cache"
	"github.com/xdsrelay/xdsrelay/internal/lockorder"
	"github.com/xdsrelay/xdsrelay/internal/metrics"
	"github.com/xdsrelay/xdsrelay/internal/xds"
)

// File serves a directory of resource files as if a control plane had sent
// them. Each .yaml, .yml or .json file holds one resource, a list of them, or
// (YAML) several documents; a resource is the proto3 JSON form of a
// google.protobuf.Any ({"@type": "type.googleapis.com/...", ...}), checked
// against its proto's validation rules. The directory is watched: a change is
// served to every group; a change that does not load is reported and
// ignored, keeping what was served, and an invalid resource is reported and
// its last good version kept.
type File struct {
	// Read-only after NewFile.
	dir      string
	log      *slog.Logger
	invalidG *metrics.Value // resources currently rejected as invalid

	// Guarded by mu.
	mu        lockorder.Mutex[fileMu]
	resources map[string]map[string]*cache.Resource // type → name → resource; replaced whole, never mutated
	wakes     map[chan struct{}]struct{}
	loaded    time.Time         // when the files last loaded
	invalid   []invalidResource // rejected by the last load
	loadErr   error             // why the files last failed to load; nil once they load
}

// Status reports the files as a connected upstream whose last response is
// the last successful load, with what the files hold that is not served.
func (f *File) Status() Status {
	f.mu.Lock()
	defer f.mu.Unlock()
	return Status{Connected: true, LastResponse: f.loaded, Invalid: f.problemsLocked()}
}

// problemsLocked says what the files hold that is not served, and why.
func (f *File) problemsLocked() string {
	var ps []string
	if f.loadErr != nil {
		ps = append(ps, fmt.Sprintf("resource files do not load, serving the previous ones: %v", f.loadErr))
	}
	for _, r := range f.invalid {
		kept := "not served"
		if r.kept {
			kept = "its last good version is served"
		}
		ps = append(ps, fmt.Sprintf("invalid resource (%s): %s", kept, r))
	}
	return strings.Join(ps, "; ")
}

// FileMetrics registers the resource files' gauge on reg, at 0, and
// returns it: a relay registers it whatever its upstreams, so that it is on
// /metrics from the start.
func FileMetrics(reg *metrics.Registry) *metrics.Value {
	return reg.Gauge("xdsrelay_file_invalid_resources",
		"Resources in the resource files that break their protos' validation rules and are not served.").With()
}

// NewFile loads dir; an error names the file that does not load, or the
// file, resource and field of an invalid resource. reg, if not nil, gets
// the file source's metrics.
func NewFile(dir string, logger *slog.Logger, reg *metrics.Registry) (*File, error) {
	if logger == nil {
		logger = slog.Default()
	}
	if reg == nil {
		reg = &metrics.Registry{}
	}
	f := &File{dir: dir, log: logger.With("component", "upstream", "dir", dir), wakes: make(map[chan struct{}]struct{}),
		invalidG: FileMetrics(reg)}
	l, err := loadDir(dir)
	if err != nil {
		return nil, err
	}
	if err := l.invalidError(); err != nil {
		return nil, err
	}
	f.resources, f.loaded = l.resources, time.Now()
	return f, nil
}

// Count returns how many resources are loaded.
func (f *File) Count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, byName := range f.resources {
		n += len(byName)
	}
	return n
}

// Run watches the directory until ctx is done.
func (f *File) Run(ctx context.Context) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("upstream: watch %s: %w", f.dir, err)
	}
	defer w.Close()
	if err := w.Add(f.dir); err != nil {
		return fmt.Errorf("upstream: watch %s: %w", f.dir, err)
	}
	// What changed between NewFile's load and the watch is read now: Run
	// starts on a goroutine of its own, after clients may have been served.
	// The files are read again whatever their times say (a file's time
	// comes from a coarser clock than time.Now, so a write just after the
	// load can look older than it); versions are content hashes, so what
	// did not change is not sent again.
	f.reload()
	var settle <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-w.Errors:
			f.log.Warn("watching resource files", "error", err)
		case <-w.Events:
			// Editors write in several steps: reload once they settle.
			settle = time.After(100 * time.Millisecond)
		case <-settle:
			settle = nil
			f.reload()
		}
	}
}

func (f *File) reload() {
	l, err := loadDir(f.dir)
	if err != nil {
		f.log.Error("resource files changed but do not load; still serving the previous ones", "error", err)
		f.mu.Lock()
		f.loadErr = err
		f.mu.Unlock()
		return
	}
	f.mu.Lock()
	l.keepLastGood(f.resources)
	changed := !sameResources(f.resources, l.resources) || len(l.invalid) > 0 || f.loadErr != nil
	f.resources, f.loaded, f.invalid, f.loadErr = l.resources, time.Now(), l.invalid, nil
	f.invalidG.Set(int64(len(l.invalid)))
	for w := range f.wakes {
		select {
		case w <- struct{}{}:
		default:
		}
	}
	f.mu.Unlock()
	f.reportInvalid(l.invalid)
	if changed { // Run's first read, or a write that changed nothing, says nothing
		f.log.Info("resource files reloaded")
	}
}

// sameResources reports whether a and b serve the same versions of the
// same resources.
func sameResources(a, b map[string]map[string]*cache.Resource) bool {
	return maps.EqualFunc(a, b, func(x, y map[string]*cache.Resource) bool {
		return maps.EqualFunc(x, y, func(r, q *cache.Resource) bool { return r.Version == q.Version })
	})
}

// reportInvalid logs each invalid resource.
func (f *File) reportInvalid(invalid []invalidResource) {
	for _, r := range invalid {
		msg := "invalid resource in the resource files; not served"
		if r.kept {
			msg = "invalid resource in the resource files; still serving its last good version"
		}
		f.log.Error(msg, "file", r.file, "type", xds.ShortName(r.typeURL), "name", r.name, "error", r.err)
	}
}

// Serve keeps c filled from the files until ctx is done: what c's group
// wants, as it changes and as the files change.
func (f *File) Serve(ctx context.Context, c *cache.Cache) {
	f.serve(ctx, Group{Cache: c, Interest: c, Owns: func(string, string) bool { return true }})
}

// serve keeps g's cache filled with what g.Interest wants of the names
// g.Owns. When the files change, the whole interest is read again: any
// wanted name may have changed. When the interest changes, only what
// entered it is read (Interest.InterestChanges): a subscription costs what
// it changes, not what the group holds (docs/architecture.md, invariant 2);
// a name that left needs nothing, the cache's retention drops it.
func (f *File) serve(ctx context.Context, g Group) {
	wake := make(chan struct{}, 1)
	f.mu.Lock()
	f.wakes[wake] = struct{}{}
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		delete(f.wakes, wake)
		f.mu.Unlock()
	}()
	var changes map[string]map[string]bool
	whole := true
	for {
		if whole {
			g.Interest.InterestChanges() // what the whole read covers
			f.apply(g)
		} else {
			f.applyChanges(g, changes)
		}
		select {
		case <-ctx.Done():
			return
		case <-g.Interest.InterestChanged():
			changes, whole = g.Interest.InterestChanges()
		case <-wake:
			whole = true
		}
	}
}

// files is the loaded resources: replaced whole, never changed.
func (f *File) files() map[string]map[string]*cache.Resource {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.resources
}

// apply gives the group what it wants, type by type in the spec's order
// (Clusters and endpoints before the Listeners and Routes that use them).
func (f *File) apply(g Group) {
	rs := f.files()
	interest := g.Interest.Interest()
	types := slices.SortedFunc(maps.Keys(interest), func(a, b string) int { return xds.Rank(a) - xds.Rank(b) })
	for _, typeURL := range types {
		applyType(g, rs, typeURL, interest[typeURL])
	}
}

// applyChanges gives the group what entered its interest: the names, or a
// type's whole state when its wildcard entered.
func (f *File) applyChanges(g Group, changes map[string]map[string]bool) {
	rs := f.files()
	types := slices.SortedFunc(maps.Keys(changes), func(a, b string) int { return xds.Rank(a) - xds.Rank(b) })
	for _, typeURL := range types {
		names := changes[typeURL]
		if names["*"] {
			applyType(g, rs, typeURL, g.Interest.TypeInterest(typeURL))
			continue
		}
		var in cache.Interest
		for n, wanted := range names {
			if wanted {
				in.Names = append(in.Names, n)
			}
		}
		if len(in.Names) > 0 {
			applyType(g, rs, typeURL, in)
		}
	}
}

// applyType gives the group what in wants of one type, from rs (the
// files' resources, by type), after what those point at (applyReferents);
// a wanted name that no file holds is reported as not existing, at once:
// the files are the whole of what there is, so no timer needs to pass
// (see absentError).
func applyType(g Group, rs map[string]map[string]*cache.Resource, typeURL string, in cache.Interest) {
	c, byName := g.Cache, rs[typeURL]
	var ups []*cache.Resource
	var removed, missing []string
	if in.Wildcard {
		for n, r := range byName {
			if g.Owns(typeURL, n) {
				ups = append(ups, r)
			}
		}
		for n := range c.Versions(typeURL) {
			if _, ok := byName[n]; !ok && g.Owns(typeURL, n) {
				removed = append(removed, n)
			}
		}
	}
	for _, n := range in.Names {
		if r, ok := byName[n]; ok {
			ups = append(ups, r)
		} else {
			removed = append(removed, n)
			missing = append(missing, n)
		}
	}
	applyReferents(g, rs, ups)
	c.Apply(typeURL, cache.Change{Upserts: ups, Removed: removed, Errors: absentErrors(c, typeURL, missing), Synced: in.Wildcard})
}

// applyReferents applies, before ups, what they point at and would wait
// for that the files hold and the cache does not hold at that version: the
// Clusters a Listener or a Route names, then, before those, their
// endpoints (docs/architecture.md, invariant 18 "Make before break,
// whatever the order upstream"; spec "Eventual consistency
// considerations"), as a change that goes ahead of what points at it
// (cache.Change.Ahead): the files hold every resource there is at once,
// so in that order nothing waits for what is coming, and the relay's word
// for a control plane's unsafe order says nothing of the files. What is
// applied so is then fetched as the group's interest (a reference), as it
// would be without this, and found held.
func applyReferents(g Group, rs map[string]map[string]*cache.Resource, ups []*cache.Resource) {
	clusters := referents(g, rs, resourcev3.ClusterType, ups)
	endpoints := referents(g, rs, resourcev3.EndpointType, clusters)
	for _, step := range []struct {
		typeURL string
		res     []*cache.Resource
	}{{resourcev3.EndpointType, endpoints}, {resourcev3.ClusterType, clusters}} {
		if len(step.res) > 0 {
			g.Cache.Apply(step.typeURL, cache.Change{Upserts: step.res, Ahead: true})
		}
	}
}

// referents are the resources of typeURL that rs hold, g owns, and from
// point at, but for those the cache holds at that version already.
func referents(g Group, rs map[string]map[string]*cache.Resource, typeURL string, from []*cache.Resource) []*cache.Resource {
	var names []string
	for _, r := range from {
		for _, ref := range r.Refs {
			if ref.TypeURL == typeURL && rs[typeURL][ref.Name] != nil && g.Owns(typeURL, ref.Name) && !slices.Contains(names, ref.Name) {
				names = append(names, ref.Name)
			}
		}
	}
	if len(names) == 0 {
		return nil
	}
	var out []*cache.Resource
	for i, l := range g.Cache.Get(typeURL, names) {
		if r := rs[typeURL][names[i]]; l.Resource == nil || l.Resource.Version != r.Version {
			out = append(out, r)
		}
	}
	return out
}

// absentMessage is the NOT_FOUND error's message for a name no resource
// file defines. It names no path: clients read it.
const absentMessage = "no resource file of the relay defines it"

// absentErrors are NOT_FOUND errors (gRFC A88: the same as a removal) for
// the names subscribed by name that no file defines and the cache does not
// hold, but for those that already carry one: a reload does not send them
// again. A name the cache holds is removed as a control plane removes it,
// through the release step: a mass removal waits for the guard, which an
// error sent beside it would defeat; once removed, the next reload gives
// it its error. Delta clients
// learn it from removed_resources; a SotW client has no other word for a
// name it never had ("Knowing When a Requested Resource Does Not Exist"):
// the error goes in the response, or, when it is all a one-type stream's
// first answer would carry, ends the stream with NOT_FOUND, which a client
// that does not read resource_errors takes at once (gRFC A57), instead of
// waiting for its 15 s does-not-exist timer.
func absentErrors(c *cache.Cache, typeURL string, names []string) []*cache.ResourceError {
	var errs []*cache.ResourceError
	for _, l := range c.Get(typeURL, names) {
		if l.Resource != nil || l.Absent && l.Error != nil && l.Error.Code == int32(codes.NotFound) && l.Error.Message == absentMessage {
			continue
		}
		errs = append(errs, xds.NewError(l.Name, codes.NotFound, absentMessage))
	}
	return errs
}

// loaded is what one load of the directory gives.
type loaded struct {
	resources map[string]map[string]*cache.Resource // type → name → resource
	invalid   []invalidResource                     // decoded but breaking their protos' rules; not in resources
}

// invalidResource is a resource that decodes but breaks its proto's rules.
type invalidResource struct {
	file, typeURL, name string
	n                   int   // its number in the file, from 1
	err                 error // names the field
	kept                bool  // its last good version is served instead
}

func (r invalidResource) String() string {
	return fmt.Sprintf("%s: %s %q: %v", r.file, xds.ShortName(r.typeURL), r.name, r.err)
}

func loadDir(dir string) (*loaded, error) {
	l, errs := loadAll(dir)
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return l, nil
}

// loadAll loads every file of dir, and returns every file's error beside
// what the others hold.
func loadAll(dir string) (*loaded, []error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		if wd, wdErr := os.Getwd(); errors.Is(err, fs.ErrNotExist) && !filepath.IsAbs(dir) && wdErr == nil {
			err = fmt.Errorf("%w (a relative file:// directory is read from the working directory, %s)", err, wd)
		}
		return nil, []error{fmt.Errorf("upstream: resource directory: %w", err)}
	}
	l := &loaded{resources: make(map[string]map[string]*cache.Resource)}
	where := make(map[string]string) // type/name → file, to report duplicates
	var errs []error
	for _, e := range entries {
		ext := strings.ToLower(filepath.Ext(e.Name()))
		if e.IsDir() || (ext != ".yaml" && ext != ".yml" && ext != ".json") {
			continue
		}
		errs = append(errs, l.addFile(filepath.Join(dir, e.Name()), where)...)
	}
	return l, errs
}

// CheckDir loads the resource files of dir as NewFile does, and returns how
// many resources they hold and every error: each file that does not load
// (with the line and column, in the file, of what is wrong, when the
// decoder says where) and each invalid resource.
func CheckDir(dir string) (resources int, errs []error) {
	l, errs := loadAll(dir)
	if l == nil {
		return 0, errs
	}
	for _, r := range l.invalid {
		errs = append(errs, fmt.Errorf("upstream: invalid resource: %s: resource %d: %s %q: %v", r.file, r.n, xds.ShortName(r.typeURL), r.name, r.err))
	}
	for _, byName := range l.resources {
		resources += len(byName)
	}
	return resources, errs
}

// addFile adds the resources of one file; an invalid one is set aside.
// It returns every error of the file: each resource that does not load,
// with its number in the file, and a file that cannot be read or parsed
// on from where it cannot.
func (l *loaded) addFile(path string, where map[string]string) []error {
	anys, fileErrs := loadFile(path)
	var errs []error
	for _, err := range fileErrs {
		errs = append(errs, fmt.Errorf("upstream: %s: %w", path, err))
	}
	for _, fa := range anys {
		if err := l.addResource(path, fa, where); err != nil {
			errs = append(errs, fmt.Errorf("upstream: %s: resource %d: %w", path, fa.n, err))
		}
	}
	return errs
}

// addResource adds one resource of a file, or sets it aside as invalid.
func (l *loaded) addResource(path string, fa fileAny, where map[string]string) error {
	name, m, err := decodeFileResource(fa.a)
	if err != nil {
		return err
	}
	key := fa.a.GetTypeUrl() + "/" + name
	if prev, dup := where[key]; dup {
		return fmt.Errorf("%s %q is also defined in %s", xds.ShortName(fa.a.GetTypeUrl()), name, prev)
	}
	where[key] = path
	if err := validate(m); err != nil {
		l.invalid = append(l.invalid, invalidResource{file: path, n: fa.n, typeURL: xds.Canonical(fa.a.GetTypeUrl()), name: name, err: err})
		return nil
	}
	r, err := xds.Encode(name, "", fa.a, nil, nil)
	if err != nil {
		return err
	}
	l.add(xds.Canonical(fa.a.GetTypeUrl()), r)
	return nil
}

func (l *loaded) add(typeURL string, r *cache.Resource) {
	if l.resources[typeURL] == nil {
		l.resources[typeURL] = make(map[string]*cache.Resource)
	}
	l.resources[typeURL][r.Name] = r
}

// keepLastGood serves, in place of each invalid resource, the version of it
// that prev served, if any.
// Spec: "Filesystem subscriptions" (the last valid configuration continues
// to apply when an update is rejected).
func (l *loaded) keepLastGood(prev map[string]map[string]*cache.Resource) {
	for i, bad := range l.invalid {
		if r := prev[bad.typeURL][bad.name]; r != nil {
			l.add(bad.typeURL, r)
			l.invalid[i].kept = true
		}
	}
}

// invalidError is the startup error for invalid resources: there is no
// last good version to serve instead.
func (l *loaded) invalidError() error {
	if len(l.invalid) == 0 {
		return nil
	}
	err := fmt.Errorf("upstream: invalid resource: %s", l.invalid[0])
	if n := len(l.invalid) - 1; n > 0 {
		err = fmt.Errorf("%w (and %d more invalid resources)", err, n)
	}
	return err
}

// fileAny is a resource of a file, and its number in the file, from 1.
type fileAny struct {
	a *anypb.Any
	n int
}

// loadFile reads the Any resources of one file, and says what is wrong
// with each that does not load, by its number in the file; an error that
// the JSON decoder places is placed in the file as written: line and
// column. A YAML syntax error ends the file there: what follows cannot be
// read.
func loadFile(path string) ([]fileAny, []error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, []error{err}
	}
	docs, err := yamlDocs(data)
	var errs []error
	if err != nil {
		errs = append(errs, err)
	}
	out := make([]fileAny, 0, len(docs))
	for i, doc := range docs {
		j := yamlJSON{max: max(64*len(data), 1<<20)}
		if err := j.node(doc); err != nil {
			errs = append(errs, fmt.Errorf("resource %d (line %d): %w", i+1, doc.Line, err))
			continue
		}
		a := &anypb.Any{}
		if err := protojson.Unmarshal(j.b, a); err != nil {
			errs = append(errs, fmt.Errorf("resource %d: %w", i+1, j.placed(err)))
			continue
		}
		out = append(out, fileAny{a: a, n: i + 1})
	}
	return out, errs
}

// yamlDocs is the resources of a file's YAML documents, in order: each
// document's, or each of a document that is a list; and the syntax error
// that stops the reading, if any, with the number the resource it is in
// would have, when every document before it held one.
func yamlDocs(data []byte) ([]*yaml.Node, error) {
	var docs []*yaml.Node
	singles := true                               // every document so far held one resource
	dec := yaml.NewDecoder(bytes.NewReader(data)) // JSON is YAML too
	for {
		var doc yaml.Node
		if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
			return docs, nil
		} else if err != nil {
			err = yamlLine(data, err)
			if singles {
				err = fmt.Errorf("resource %d: %w", len(docs)+1, err)
			}
			return docs, err
		}
		top := &doc
		if doc.Kind == yaml.DocumentNode && len(doc.Content) == 1 {
			top = doc.Content[0]
		}
		switch {
		case top.Kind == yaml.SequenceNode:
			docs, singles = append(docs, top.Content...), false
		case top.Kind == yaml.ScalarNode && top.Tag == "!!null", top.Kind == yaml.DocumentNode:
		default:
			docs = append(docs, top)
		}
	}
}

// yamlParserError matches the errors yaml.v3's parser (not its scanner)
// gives, with their line: the line of the mark counted from 0 where the
// scanner's count from 1 (yaml.v3 decode.go, parser.fail).
var yamlParserError = regexp.MustCompile(`^yaml: line (\d+): ((?:did not find expected|found duplicate|found incompatible|found undefined tag handle).*)$`)

// yamlLine is a YAML syntax error of data placed as an editor shows it:
// its line counted from 1, where yaml.v3 counts a parser's error from 0;
// and the line of the problem, where yaml.v3 gives the line where what
// it was parsing begins (a mapping, a list): the first line from there
// at whose end the file, cut there, fails in the same words (yamlProblem).
func yamlLine(data []byte, err error) error {
	m := yamlParserError.FindStringSubmatch(err.Error())
	if m == nil {
		return err
	}
	line, _ := strconv.Atoi(m[1])
	return fmt.Errorf("yaml: line %d: %s", yamlProblem(data, line+1, m[2]), m[2])
}

// Bounds of yamlProblem's search, which reads the file once a line: the
// lines after the one yaml.v3 gives, and the file's size.
const (
	yamlProblemLines = 200
	yamlProblemBytes = 256 << 10
)

// yamlProblem is the first line from from (counted from 1) at whose end
// data, cut there, fails to parse in the words given; from if none does
// within the bounds.
func yamlProblem(data []byte, from int, words string) int {
	if len(data) > yamlProblemBytes {
		return from
	}
	end := 0
	for i, line := range bytes.SplitAfter(data, []byte("\n")) {
		end += len(line)
		switch n := i + 1; {
		case n < from:
		case n > from+yamlProblemLines:
			return from
		case parseFails(data[:end], words):
			return n
		}
	}
	return from
}

// parseFails reports whether data fails to parse as YAML in the words given.
func parseFails(data []byte, words string) bool {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for {
		var doc yaml.Node
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			return false
		}
		if err != nil {
			return strings.HasSuffix(err.Error(), words)
		}
	}
}

// decodeFileResource decodes a resource of a type the relay carries and
// finds its name.
func decodeFileResource(a *anypb.Any) (string, proto.Message, error) {
	if !xds.Known(a.GetTypeUrl()) {
		return "", nil, fmt.Errorf("type %q is not an xDS resource type the relay carries", a.GetTypeUrl())
	}
	m, err := a.UnmarshalNew()
	if err != nil {
		return "", nil, err
	}
	name := resourceName(m.ProtoReflect())
	if name == "" {
		return "", nil, fmt.Errorf("resource of type %s has no name", a.GetTypeUrl())
	}
	return name, m, nil
}

// resourceName is a resource's name field: name, or cluster_name for a
// ClusterLoadAssignment.
func resourceName(m protoreflect.Message) string {
	fields := m.Descriptor().Fields()
	for _, f := range []protoreflect.Name{"name", "cluster_name"} {
		if fd := fields.ByName(f); fd != nil && fd.Kind() == protoreflect.StringKind {
			return m.Get(fd).String()
		}
	}
	return ""
}
