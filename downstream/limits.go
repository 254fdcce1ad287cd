package downstream

import (
	"context"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/xdsrelay/xdsrelay/cache"
)

// Limits are the bounds the downstream edge enforces, the limits.* keys of
// the configuration (docs/architecture.md, invariant 9 "Every bound is
// explicit"). A zero field
// is no bound.
type Limits struct {
	// MaxStreams is limits.max_streams: open xDS streams in total.
	MaxStreams int
	// StreamRate and StreamBurst are limits.stream_rate and
	// limits.stream_burst: new streams admitted a second, in bursts of up
	// to StreamBurst.
	StreamRate  float64
	StreamBurst int
	// FirstRequestTimeout is limits.first_request_timeout: a stream that
	// sends no request for this long is ended.
	FirstRequestTimeout time.Duration
	// MaxNamesPerStream is limits.max_names_per_stream: names a stream (or
	// a poll) subscribes to, across types.
	MaxNamesPerStream int
	// RESTReadTimeout is limits.rest_read_timeout: how long a REST-JSON
	// request's body may take to arrive (its headers are bounded by the
	// HTTP server).
	RESTReadTimeout time.Duration
	// MaxPolls is limits.max_polls: REST-JSON and gRPC Fetch polls in
	// progress at once, held ones included.
	MaxPolls int
}

// LimitError refuses a stream, request or poll at a configured bound. At the
// edge it becomes RESOURCE_EXHAUSTED (429 over REST-JSON, 408 for a request
// too slow to arrive) with Error() as the message, which names the key, and
// is counted under the key in xdsrelay_limit_refusals_total.
type LimitError struct {
	Key   string // the configuration key: limits.max_groups, …
	Limit string // its value, as the message shows it
	What  string // what was refused
}

func (e *LimitError) Error() string {
	return fmt.Sprintf("xdsrelay: %s (%s) reached: %s", e.Key, e.Limit, e.What)
}

// label is the key without its section: the metric's label value.
func (e *LimitError) label() string { return strings.TrimPrefix(e.Key, "limits.") }

// LimitLabels are the limit label values of xdsrelay_limit_refusals_total:
// every key a LimitError names, here or in the relay (max_groups). Each
// series exists at 0 from the start.
var LimitLabels = []string{"max_groups", "max_names_per_stream", "max_names_per_group", "max_streams",
	"stream_rate", "first_request_timeout", "rest_read_timeout", "max_polls"}

// admission counts open streams and polls in progress, and rations new
// streams.
type admission struct {
	// Read-only after newAdmission.
	max      int
	maxPolls int
	rate     *rate.Limiter // nil without a rate

	// Atomic.
	open  atomic.Int64 // streams
	polls atomic.Int64
}

func newAdmission(l Limits) *admission {
	a := &admission{max: l.MaxStreams, maxPolls: l.MaxPolls}
	if l.StreamRate > 0 {
		a.rate = rate.NewLimiter(rate.Limit(l.StreamRate), max(l.StreamBurst, 1))
	}
	return a
}

// admitStream admits a new stream, or refuses it at limits.max_streams or
// limits.stream_rate. Call release when an admitted stream ends.
func (s *Server) admitStream() (release func(), err error) {
	a := s.admission
	if n := a.open.Add(1); a.max > 0 && n > int64(a.max) {
		a.open.Add(-1)
		return nil, &LimitError{Key: "limits.max_streams", Limit: strconv.Itoa(a.max), What: "too many open streams; retry later"}
	}
	if a.rate != nil && !a.rate.Allow() {
		a.open.Add(-1)
		limit := fmt.Sprintf("%g/s, burst %d", float64(a.rate.Limit()), a.rate.Burst())
		return nil, &LimitError{Key: "limits.stream_rate", Limit: limit, What: "too many new streams; retry later"}
	}
	return func() { a.open.Add(-1) }, nil
}

// admitPoll admits a REST-JSON or gRPC Fetch poll, or refuses it at
// limits.max_polls. Call release when an admitted poll is answered.
func (s *Server) admitPoll() (release func(), err error) {
	a := s.admission
	if n := a.polls.Add(1); a.maxPolls > 0 && n > int64(a.maxPolls) {
		a.polls.Add(-1)
		return nil, &LimitError{Key: "limits.max_polls", Limit: strconv.Itoa(a.maxPolls), What: "too many polls in progress; retry later"}
	}
	return func() { a.polls.Add(-1) }, nil
}

// startStream waits for a stream's first request (firstRequest) and then
// registers the stream with Drain (goLive): the first steps of every
// stream, xDS and load reports alike. The caller removes ls when the
// stream ends; first is nil with err set if the stream is not to run.
func startStream[Req any](ctx context.Context, s *Server, recv func() (*Req, error)) (first *Req, ls *liveStream, err error) {
	if first, err = firstRequest(ctx, s, recv); first == nil {
		return nil, nil, err
	}
	if ls, err = s.goLive(ctx); err != nil {
		return nil, nil, err
	}
	return first, ls, nil
}

// firstRequest waits for a stream's first request, for
// limits.first_request_timeout at most; the stream counts as pending
// meanwhile. A stream the client closed first yields (nil, nil). The wait
// is the one Recv that runs on a goroutine of its own, so that the timeout
// and Drain end the stream with their own status; once it returns, the
// handler reads the stream itself.
func firstRequest[Req any](ctx context.Context, s *Server, recv func() (*Req, error)) (*Req, error) {
	s.pending.Inc()
	defer s.pending.Dec()
	type result struct {
		req *Req
		err error
	}
	got := make(chan result, 1)
	go func() {
		req, err := recv()
		got <- result{req, err}
	}()
	var timeout chan struct{}
	if s.deadlines != nil {
		timeout = make(chan struct{}, 1)
		w := s.deadlines.add(timeout)
		defer w.stop()
	}
	select {
	case r := <-got:
		if r.err != nil {
			return nil, recvError(r.err)
		}
		return r.req, nil
	case <-timeout:
		return nil, &LimitError{Key: "limits.first_request_timeout", Limit: s.limits.FirstRequestTimeout.String(), What: "no request on the stream"}
	case <-s.drain:
		return nil, errDraining
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// checkNames refuses a stream or poll that would subscribe to more than
// limits.max_names_per_stream names, holding held and adding more.
func (s *Server) checkNames(held, adding int) error {
	if max := s.limits.MaxNamesPerStream; max > 0 && held+adding > max {
		return &LimitError{Key: "limits.max_names_per_stream", Limit: strconv.Itoa(max),
			What: fmt.Sprintf("the stream holds %d names and the request adds %d", held, adding)}
	}
	return nil
}

// watchNames subscribes the stream to names of typeURL, or refuses them all
// at limits.max_names_per_stream or limits.max_names_per_group. A name the
// client's grant refuses (see refuse) is held by the stream, and counts
// toward the stream's bound, but is not watched.
func (b *streamBase) watchNames(typeURL string, names []string) error {
	names = watchable(names)
	if err := b.srv.checkNames(b.names, len(names)); err != nil {
		return err
	}
	if err := watchGroup(b.cache, b.watch, typeURL, b.refuse(names)); err != nil {
		return err
	}
	b.names += len(names)
	return nil
}

// unwatchNames unsubscribes the stream from names of typeURL, which it
// subscribed to with watchNames.
func (b *streamBase) unwatchNames(typeURL string, names []string) {
	held := 0
	for _, n := range names {
		if n != noName {
			held++
			delete(b.refused, n) // if it was refused, it was never watched
		}
	}
	b.cache.Unwatch(b.watch, typeURL, names...)
	b.names -= held
}

// watchGroup is c.Watch, its refusal at the group's bound made a
// LimitError naming limits.max_names_per_group.
func watchGroup(c *cache.Cache, w *cache.Watch, typeURL string, names []string) error {
	err := c.Watch(w, typeURL, names...)
	var me *cache.MaxNamesError
	if errors.As(err, &me) {
		return &LimitError{Key: "limits.max_names_per_group", Limit: strconv.Itoa(me.Max),
			What: fmt.Sprintf("the group fetches %d names (wanted or referenced) and the request adds %d", me.Wanted, me.Adding)}
	}
	return err
}

// edge turns a limit refusal into RESOURCE_EXHAUSTED naming the key, and
// counts it; any other error is returned as it is.
func (s *Server) edge(err error) error {
	var le *LimitError
	if !errors.As(err, &le) {
		return err
	}
	s.refusals.With(le.label()).Inc()
	return status.Error(codes.ResourceExhausted, le.Error())
}

// joinError is how a failed Join reaches the client: a limit refusal as it
// is (the edge turns it into RESOURCE_EXHAUSTED), anything else UNAVAILABLE.
func joinError(err error) error {
	var le *LimitError
	if errors.As(err, &le) {
		return le
	}
	return status.Error(codes.Unavailable, fmt.Sprintf("xdsrelay: %v", err))
}

// restJSON answers 415 to a REST-JSON request whose body is not declared
// application/json, reporting whether the request may go on.
func restJSON(w http.ResponseWriter, r *http.Request) bool {
	mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err == nil && mt == "application/json" {
		return true
	}
	http.Error(w, "xdsrelay: Content-Type must be application/json", http.StatusUnsupportedMediaType)
	return false
}

// readDeadline bounds the reading of a REST-JSON request's body by
// limits.rest_read_timeout. Call the result once the whole body is read: it
// lifts the deadline, so that a held poll is not cut by it (only the body's
// arrival is bounded, never the response). A body that failed to arrive
// keeps the deadline, so that the server does not wait for its rest.
func (s *Server) readDeadline(w http.ResponseWriter) (lift func()) {
	d := s.limits.RESTReadTimeout
	if d <= 0 {
		return func() {}
	}
	rc := http.NewResponseController(w)
	if rc.SetReadDeadline(time.Now().Add(d)) != nil {
		return func() {}
	}
	return func() { rc.SetReadDeadline(time.Time{}) }
}

// bodyError is the error for a REST-JSON body that could not be read: a
// limit for one too slow (408), RESOURCE_EXHAUSTED for one too large (413),
// and INVALID_ARGUMENT for anything else, a client that hung up mid-body or
// broken chunked framing (400).
func (s *Server) bodyError(err error) error {
	var tooLarge *http.MaxBytesError
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		return &LimitError{Key: "limits.rest_read_timeout", Limit: s.limits.RESTReadTimeout.String(), What: "the request body did not arrive in time"}
	case errors.As(err, &tooLarge):
		return status.Errorf(codes.ResourceExhausted, "xdsrelay: request body: %v", err)
	}
	return status.Errorf(codes.InvalidArgument, "xdsrelay: request body: %v", err)
}

// restRefusal answers a REST-JSON request refused at a limit, reporting
// whether err was one: 408 for a body too slow to arrive, 429 otherwise.
// (edge has counted it.)
func restRefusal(w http.ResponseWriter, err error) bool {
	var le *LimitError
	if !errors.As(err, &le) {
		return false
	}
	code := http.StatusTooManyRequests
	if le.Key == "limits.rest_read_timeout" {
		code = http.StatusRequestTimeout
	}
	http.Error(w, le.Error(), code)
	return true
}
