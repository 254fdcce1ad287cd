package downstream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"

	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/xdsrelay/xdsrelay/cache"
	"github.com/xdsrelay/xdsrelay/internal/xds"
)

// errNotModified ends a long poll whose resources did not change before its
// deadline.
var errNotModified = errors.New("not modified")

// restPaths maps REST-JSON paths to the types they serve ("REST-JSON polling
// subscriptions"; ADS and incremental-only types are not available there).
var restPaths = map[string]string{
	resourcev3.FetchListeners:        resourcev3.ListenerType,
	resourcev3.FetchRoutes:           resourcev3.RouteType,
	resourcev3.FetchScopedRoutes:     resourcev3.ScopedRouteType,
	resourcev3.FetchClusters:         resourcev3.ClusterType,
	resourcev3.FetchEndpoints:        resourcev3.EndpointType,
	resourcev3.FetchSecrets:          resourcev3.SecretType,
	resourcev3.FetchRuntimes:         resourcev3.RuntimeType,
	resourcev3.FetchExtensionConfigs: resourcev3.ExtensionConfigType,
}

// maxRESTBody bounds a REST-JSON request body.
const maxRESTBody = 1 << 20

// fetch answers one polling request, REST-JSON or a gRPC Fetch: every
// requested resource (or all, for a wildcard), once the cache knows them.
// The version_info is a digest of the names and versions it carries; when
// the request already has that version the poll is held until something
// changes or ctx ends, and an unchanged set is never answered ("REST-JSON
// polling subscriptions"). Polls in progress are bounded by limits.max_polls.
func (s *Server) fetch(ctx context.Context, who client, req *discoverypb.DiscoveryRequest, typeURL string) (*discoverypb.DiscoveryResponse, error) {
	done, err := s.admitPoll()
	if err != nil {
		return nil, err
	}
	defer done()
	if req.GetTypeUrl() != "" && req.GetTypeUrl() != typeURL {
		return nil, status.Errorf(codes.InvalidArgument, "xdsrelay: type_url %q on a %s request", req.GetTypeUrl(), xds.ShortName(typeURL))
	}
	grant, err := s.authorize(who, req.GetNode())
	if err != nil {
		return nil, err
	}
	for _, n := range req.GetResourceNames() {
		if !grant.Allows(n) {
			// A poll is one request: it is refused whole, naming what.
			auth, _ := xds.Authority(n)
			return nil, status.Errorf(codes.PermissionDenied, "xdsrelay: downstream.authorization.rules do not let this client ask for the xdstp authority %q (%q)", xds.Clip(auth), xds.Clip(n))
		}
	}
	c, release, err := s.join(req.GetNode(), who)
	if err != nil {
		return nil, err
	}
	defer release()
	s.requests.With(xds.ShortName(typeURL)).Inc()
	w := cache.NewWatch()
	defer c.Release(w)
	names := slices.Clone(req.GetResourceNames())
	wildcard := len(names) == 0 || slices.Contains(names, "*")
	names = slices.DeleteFunc(names, func(n string) bool { return n == "*" })
	slices.Sort(names)
	names = slices.Compact(names) // a name asked twice is subscribed, counted and answered once
	if wildcard {
		c.WatchWildcard(w, typeURL)
	}
	if err := s.checkNames(0, len(watchable(names))); err != nil {
		return nil, err
	}
	if err := watchGroup(c, w, typeURL, watchable(names)); err != nil {
		return nil, err
	}
	for {
		rs, ready := pollState(c, typeURL, wildcard, names)
		if ready {
			if v := digest(rs); v != req.GetVersionInfo() {
				resp, err := pollResponse(typeURL, v, rs)
				if err == nil {
					s.pushed(typeURL, proto.Size(resp), time.Time{}, time.Time{}) // a poll is not a push
				}
				return resp, err
			}
		}
		select {
		case <-w.Ready():
			w.Take()
		case <-s.drain:
			return nil, errDraining
		case <-ctx.Done():
			return nil, errNotModified
		}
	}
}

// pollState is what a poll would answer now, and whether the cache knows
// enough to answer: the wildcard's complete state, or every requested name.
// It reads as a stream does, one view of the type as released to the group
// (cache.Read).
func pollState(c *cache.Cache, typeURL string, wildcard bool, names []string) ([]*cache.Resource, bool) {
	v := c.Read(typeURL, slices.Clone(names), wildcard) // sorted by name
	var rs []*cache.Resource
	ready := !wildcard || v.Synced
	for _, l := range v.Lookups {
		if l.Resource != nil {
			rs = append(rs, l.Resource)
		}
		if !wildcard {
			ready = ready && (l.Resource != nil || l.Absent || l.Name == noName)
		}
	}
	// Nothing yet, while a resource of the type waits for what it points
	// at, is not an answer (docs/architecture.md, invariant 18): its
	// release answers.
	return rs, ready && !(wildcard && v.Held && len(rs) == 0)
}

// digest identifies a set of resource versions (xds.StateVersion); rs is
// in name order.
func digest(rs []*cache.Resource) string {
	v := xds.NewStateVersion()
	for _, r := range rs {
		v.Add(r.Name, r.Version)
	}
	return v.String()
}

// pollResponse decodes the assembled bytes into a message, which REST needs
// for JSON and a unary gRPC method for its return value.
func pollResponse(typeURL, version string, rs []*cache.Resource) (*discoverypb.DiscoveryResponse, error) {
	msg := xds.SotWResponse(0, typeURL, version, rs)
	var b []byte
	for _, p := range msg.Parts {
		b = append(b, p...)
	}
	out := &discoverypb.DiscoveryResponse{}
	if err := proto.Unmarshal(b, out); err != nil {
		return nil, status.Errorf(codes.Internal, "xdsrelay: %v", err)
	}
	out.VersionInfo = version
	return out, nil
}

// fetchGRPC is fetch for the gRPC Fetch methods: an unchanged poll that
// reaches its deadline ends with DEADLINE_EXCEEDED.
func (s *Server) fetchGRPC(ctx context.Context, req *discoverypb.DiscoveryRequest, typeURL string) (*discoverypb.DiscoveryResponse, error) {
	poll, cancel := s.pollContext(ctx)
	defer cancel()
	resp, err := s.fetch(poll, grpcClient(ctx, "fetch"), req, typeURL)
	err = s.edge(err)
	s.ended(ctx, streamEnd{variant: "fetch", typ: typeURL, node: req.GetNode()}, err)
	if errors.Is(err, errNotModified) {
		return nil, status.Error(codes.DeadlineExceeded, "xdsrelay: no change before the poll deadline; poll again")
	}
	return resp, err
}

func (s *Server) pollContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, s.pollTimeout)
}

// RESTHandler serves REST-JSON polling: POST /v3/discovery:<type> with the
// proto3 JSON form of a DiscoveryRequest. An unchanged poll answers 304 Not
// Modified at its deadline.
// A request for any other path, or with another method, is answered 404
// or 405 with the paths there are (restUnknown).
func (s *Server) RESTHandler() http.Handler {
	mux := http.NewServeMux()
	for _, path := range slices.Sorted(maps.Keys(restPaths)) {
		typeURL := restPaths[path]
		mux.HandleFunc("POST "+path, func(w http.ResponseWriter, r *http.Request) { s.serveREST(w, r, typeURL) })
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, pattern := mux.Handler(r); pattern == "" {
			restUnknown(w, r)
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// ListenerHeader names, on the REST-JSON port's answers to what it does
// not serve, the listener that answered (ListenerREST): a command that
// meant the admin endpoint, which speaks HTTP/1.1 too, can tell it was
// pointed at the wrong port.
const (
	ListenerHeader = "Xdsrelay-Listener"
	ListenerREST   = "downstream.rest_address"
)

// restUnknown answers a request the REST-JSON port does not serve: 405
// for a path it serves, asked with another method than POST; 404
// otherwise; each with the paths there are.
func restUnknown(w http.ResponseWriter, r *http.Request) {
	w.Header().Set(ListenerHeader, ListenerREST)
	paths := slices.Sorted(maps.Keys(restPaths))
	if _, ok := restPaths[r.URL.Path]; ok {
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, fmt.Sprintf("xdsrelay: %s %s: the REST-JSON port (downstream.rest_address) is polled with POST and a DiscoveryRequest in proto3 JSON", r.Method, xds.Clip(r.URL.Path)),
			http.StatusMethodNotAllowed)
		return
	}
	http.Error(w, fmt.Sprintf("xdsrelay: no REST-JSON path %s on this port (downstream.rest_address); POST one of %s (the admin endpoint is admin.address)",
		xds.Clip(r.URL.Path), strings.Join(paths, ", ")), http.StatusNotFound)
}

func (s *Server) serveREST(w http.ResponseWriter, r *http.Request, typeURL string) {
	end := streamEnd{variant: "rest", typ: typeURL, peer: r.RemoteAddr}
	if !restJSON(w, r) {
		return
	}
	resp, err := s.pollREST(w, r, typeURL, &end)
	s.ended(r.Context(), end, s.edge(err))
	switch {
	case restRefusal(w, err):
	case errors.Is(err, errNotModified):
		w.WriteHeader(http.StatusNotModified)
	case err != nil:
		http.Error(w, status.Convert(err).Message(), httpStatus(status.Code(err)))
	default:
		writeREST(w, resp)
	}
}

// pollREST reads a REST-JSON request and answers it as a poll, noting its
// node in end.
func (s *Server) pollREST(w http.ResponseWriter, r *http.Request, typeURL string, end *streamEnd) (*discoverypb.DiscoveryResponse, error) {
	lift := s.readDeadline(w)
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxRESTBody))
	if err != nil {
		return nil, s.bodyError(err)
	}
	lift()
	req := &discoverypb.DiscoveryRequest{}
	if err := protojson.Unmarshal(body, req); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "xdsrelay: not a DiscoveryRequest in proto3 JSON: %v", err)
	}
	end.node = req.GetNode()
	ctx, cancel := s.pollContext(r.Context())
	defer cancel()
	return s.fetch(ctx, client{variant: "rest", tls: r.TLS, addr: r.RemoteAddr}, req, typeURL)
}

func writeREST(w http.ResponseWriter, resp *discoverypb.DiscoveryResponse) {
	js, err := protojson.Marshal(resp)
	if err != nil {
		http.Error(w, fmt.Sprintf("xdsrelay: %v", err), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(js)
}

func httpStatus(c codes.Code) int {
	switch c {
	case codes.InvalidArgument:
		return http.StatusBadRequest
	case codes.PermissionDenied:
		return http.StatusForbidden
	case codes.ResourceExhausted:
		return http.StatusRequestEntityTooLarge
	case codes.Unavailable:
		return http.StatusServiceUnavailable
	default:
		return http.StatusInternalServerError
	}
}

// defaultPollTimeout is how long a poll is held when nothing changes.
const defaultPollTimeout = 30 * time.Second
