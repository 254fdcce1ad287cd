package downstream

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	clusterpb "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/xdsrelay/xdsrelay/cache"
	"github.com/xdsrelay/xdsrelay/internal/metrics"
	"github.com/xdsrelay/xdsrelay/internal/xds"
)

// A poll that names a resource twice, or names "", is counted against
// limits.max_names_per_stream by the distinct names it subscribes to, as a
// stream is, and is answered with each resource once.
func TestFetchCountsDistinctNames(t *testing.T) {
	c := cache.New(cache.Options{})
	var rs []*cache.Resource
	for _, name := range []string{"a", "b"} {
		a, err := anypb.New(&clusterpb.Cluster{Name: name})
		if err != nil {
			t.Fatal(err)
		}
		r, err := xds.Encode(name, "1", a, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		rs = append(rs, r)
	}
	w := cache.NewWatch() // the cache keeps only what someone watches
	c.WatchWildcard(w, resourcev3.ClusterType)
	defer c.Release(w)
	c.Apply(resourcev3.ClusterType, cache.Change{Upserts: rs, Synced: true})
	s, err := New(Options{Groups: oneGroup{c}, Metrics: &metrics.Registry{},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Limits: Limits{MaxNamesPerStream: 2}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req := &discoverypb.DiscoveryRequest{Node: &corepb.Node{Id: "poller"}, ResourceNames: []string{"b", "a", "a", "", "b"}}
	resp, err := s.fetch(ctx, client{variant: "fetch"}, req, resourcev3.ClusterType)
	if err != nil {
		t.Fatalf("poll for 2 distinct names under a limit of 2: %v", err)
	}
	var got []string
	for _, a := range resp.GetResources() {
		cl := &clusterpb.Cluster{}
		if err := a.UnmarshalTo(cl); err != nil {
			t.Fatal(err)
		}
		got = append(got, cl.GetName())
	}
	if len(got) != 2 || got[0] != "a" || got[1] != "b" {
		t.Fatalf("poll answered %v, want [a b]", got)
	}

	req.ResourceNames = []string{"a", "b", "c"}
	if _, err := s.fetch(ctx, client{variant: "fetch"}, req, resourcev3.ClusterType); err == nil {
		t.Fatal("poll for 3 names under a limit of 2 was answered")
	}
}

// A poll held because nothing changed ends when the server drains, with
// the relay's own UNAVAILABLE status (docs/operations.md, Shutdown).
func TestFetchHeldPollEndsOnDrain(t *testing.T) {
	c := cache.New(cache.Options{})
	a, err := anypb.New(&clusterpb.Cluster{Name: "a"})
	if err != nil {
		t.Fatal(err)
	}
	r, err := xds.Encode("a", "1", a, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	w := cache.NewWatch()
	c.WatchWildcard(w, resourcev3.ClusterType)
	defer c.Release(w)
	c.Apply(resourcev3.ClusterType, cache.Change{Upserts: []*cache.Resource{r}, Synced: true})
	s, err := New(Options{Groups: oneGroup{c}, Metrics: &metrics.Registry{}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req := &discoverypb.DiscoveryRequest{Node: &corepb.Node{Id: "poller"}}
	resp, err := s.fetch(ctx, client{variant: "fetch"}, req, resourcev3.ClusterType)
	if err != nil {
		t.Fatal(err)
	}
	req.VersionInfo = resp.GetVersionInfo() // the client has it: the poll is held
	ended := make(chan error, 1)
	go func() {
		_, err := s.fetch(ctx, client{variant: "fetch"}, req, resourcev3.ClusterType)
		ended <- err
	}()
	s.Drain()
	select {
	case err := <-ended:
		if err != errDraining {
			t.Fatalf("the held poll ended with %v, want %v", err, errDraining)
		}
	case <-ctx.Done():
		t.Fatal("the held poll did not end on Drain")
	}
}

// errReader fails every read with err.
type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }

// A REST-JSON body that cannot be read is 413 when it is too large, and 400
// for any other reason (the client hung up mid-body, broken framing), never
// 413.
func TestRESTBodyErrors(t *testing.T) {
	s, err := New(Options{Groups: oneGroup{cache.New(cache.Options{})}, Metrics: &metrics.Registry{},
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		body io.Reader
		want int
	}{
		{"client hung up", io.MultiReader(strings.NewReader(`{"node": {"id": "a"`), errReader{io.ErrUnexpectedEOF}), http.StatusBadRequest},
		{"broken chunked framing", errReader{errors.New("invalid byte in chunk length")}, http.StatusBadRequest},
		{"too large", strings.NewReader(`{"node": {"id": "` + strings.Repeat("a", maxRESTBody) + `"}}`), http.StatusRequestEntityTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := httptest.NewRequest(http.MethodPost, resourcev3.FetchClusters, tc.body)
			req.Header.Set("Content-Type", "application/json")
			w := httptest.NewRecorder()
			s.RESTHandler().ServeHTTP(w, req)
			if w.Code != tc.want || !strings.Contains(w.Body.String(), "xdsrelay: request body: ") {
				t.Errorf("answered %d %q, want %d about the request body", w.Code, w.Body.String(), tc.want)
			}
		})
	}
}
