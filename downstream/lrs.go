package downstream

import (
	"context"
	"slices"
	"sync/atomic"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	lrspb "github.com/envoyproxy/go-control-plane/envoy/service/load_stats/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/xdsrelay/xdsrelay/internal/metrics"
	"github.com/xdsrelay/xdsrelay/loadstats"
)

// The load reporting service (LRS, envoy.service.load_stats.v3): clients
// report the load they send to each cluster, and are told what to report
// and how often. A stream is admitted, authorized and placed in a group as
// an xDS stream is (limits.max_streams, limits.stream_rate,
// limits.first_request_timeout, downstream.authorization, its first
// request's node), and writes its reports into the group's loadstats.Store;
// the relay sends the group's sums upstream.

// LoadGroups places a load-reporting client in its group. The relay
// implements it.
type LoadGroups interface {
	// JoinLoads returns the load store of the group the node belongs to
	// and a function to call when the stream ends. A *LimitError refuses
	// the client at a limit (limits.max_groups). from is who joins.
	JoinLoads(node *corepb.Node, from Caller) (s *loadstats.Store, release func(), err error)
}

// LoadOptions configure the load reporting service.
type LoadOptions struct {
	Groups  LoadGroups     // nil: the service is not served (UNIMPLEMENTED)
	Streams *metrics.Value // open streams (xdsrelay_lrs_streams{side="downstream"}); nil: not counted
	Reports *metrics.Value // reports received (xdsrelay_lrs_reports_total{side="downstream"}); nil: not counted
}

// variantLRS is a load report stream's variant, in logs and metrics.
const variantLRS = "lrs"

type loadServer = grpc.BidiStreamingServer[lrspb.LoadStatsRequest, lrspb.LoadStatsResponse]

// loadService is the service as gRPC registers it.
type loadService struct {
	lrspb.UnimplementedLoadReportingServiceServer
	s *Server
}

var _ lrspb.LoadReportingServiceServer = loadService{}

// StreamLoadStats serves one client's load reports.
func (ls loadService) StreamLoadStats(st loadServer) error { return ls.s.serveLoads(st) }

// defaults returns o with a value counted nowhere for each metric not given.
func (o LoadOptions) defaults() LoadOptions {
	for _, v := range []**metrics.Value{&o.Streams, &o.Reports} {
		if *v == nil {
			*v = new(metrics.Value)
		}
	}
	return o
}

// registerLoads registers the service on g, if the server has load groups.
func (s *Server) registerLoads(g *grpc.Server) {
	if s.loads.Groups != nil {
		lrspb.RegisterLoadReportingServiceServer(g, loadService{s: s})
	}
}

// serveLoads runs one stream (see runLoads) and logs how it ended.
func (s *Server) serveLoads(st loadServer) error {
	end := streamEnd{variant: variantLRS}
	release, err := s.admitStream()
	if err == nil {
		err = s.runLoads(st, &end)
		release()
	}
	err = s.edge(err)
	s.ended(st.Context(), end, err)
	return err
}

// runLoads runs one stream: its first request places it in a group, and
// it is told at once what to report; then the handler's goroutine reads
// reports into the group's store, while the send pool tells the client
// again whenever the control plane asks for something else. Only the first
// request's node counts ("Basic Protocol Overview"): Envoy repeats it in
// every report, and it is not compared again. It is taken as the client's
// xDS streams send it (see xdsNode).
func (s *Server) runLoads(st loadServer, end *streamEnd) error {
	ctx := st.Context()
	opened := time.Now()
	first, ls, err := startStream(ctx, s, st.Recv)
	if first == nil {
		return err
	}
	defer s.live.remove(ls)
	end.node = xdsNode(first.GetNode())
	who := grpcClient(ctx, end.variant)
	if _, err := s.authorize(who, end.node); err != nil {
		return err
	}
	store, release, err := s.joinLoads(end.node, who)
	if err != nil {
		return err
	}
	defer release()
	s.loads.Streams.Inc()
	defer s.loads.Streams.Dec()
	g := s.guard(ctx, st.SendMsg, end.variant, opened)
	ld := &loadStream{send: g.send}
	pm := &pump{pool: s.sends, conn: s.sends.conn(ls.addr), flush: ld.flush, guard: g}
	g.conn = pm.conn
	defer s.sends.release(pm.conn)
	rep := store.Join(end.node, pm.ready)
	ld.rep.Store(rep)
	defer rep.Leave()
	defer pm.end()
	pm.ready()
	if err := pm.runInline(); err != nil { // the first response
		return err
	}
	if len(first.GetClusterStats()) > 0 {
		ld.report(ctx, s, first, end)
	}
	// Later requests are decoded into one message: its reset drops what the
	// last one held, which the store may keep (proto.Unmarshal copies).
	req := new(lrspb.LoadStatsRequest)
	for {
		if err := st.RecvMsg(req); err != nil {
			if ferr := pm.failure(); ferr != nil {
				return ferr
			}
			return recvError(err)
		}
		ld.report(ctx, s, req, end)
	}
}

// featureSendAllClusters is what Envoy and gRPC add to the client_features
// of the node they send on their load report streams, and on no other
// (load_stats/v3/lrs.proto: send_all_clusters).
const featureSendAllClusters = "envoy.lrs.supports_send_all_clusters"

// xdsNode is the node of a load report stream as the client's xDS streams
// send it: without featureSendAllClusters. The stream is authorized as they
// are, and joins their group (client_features may be a group_by field).
func xdsNode(n *corepb.Node) *corepb.Node {
	if !slices.Contains(n.GetClientFeatures(), featureSendAllClusters) {
		return n
	}
	n = proto.Clone(n).(*corepb.Node)
	n.ClientFeatures = slices.DeleteFunc(n.ClientFeatures, func(f string) bool { return f == featureSendAllClusters })
	return n
}

// joinLoads places the stream's node in its group ("Basic Protocol
// Overview": the node is read from the first request only).
func (s *Server) joinLoads(node *corepb.Node, who client) (*loadstats.Store, func(), error) {
	if node == nil {
		return nil, nil, status.Error(codes.InvalidArgument, "xdsrelay: the first request on a load report stream must carry the node")
	}
	store, release, err := s.loads.Groups.JoinLoads(node, who.caller())
	if err != nil {
		return nil, nil, joinError(err)
	}
	return store, release, nil
}

// loadStream is one client's load report stream.
type loadStream struct {
	send func(any) error // the stream's SendMsg, guarded against stuck clients; read-only
	// rep is the stream's place in its store, set once it has joined. The
	// store may tell it to flush from the moment it joins, before the
	// handler sets rep: that flush has nothing to tell, and the handler's
	// own first flush tells the client what is asked by then.
	rep atomic.Pointer[loadstats.Reporter]
	// told is set once the client's stats left out (lrs.max_names, an
	// invalid value) have been logged: once a stream. Owned by the
	// handler's goroutine.
	told bool
}

// flush tells the client what the control plane asks, if it changed since
// the client was last told (LoadStatsResponse: every response starts a new
// reporting period for Envoy, so none is sent without a change).
func (l *loadStream) flush() error {
	rep := l.rep.Load()
	if rep == nil {
		return nil
	}
	if resp := rep.Next(); resp != nil {
		return l.send(resp)
	}
	return nil
}

func (l *loadStream) report(ctx context.Context, s *Server, req *lrspb.LoadStatsRequest, end *streamEnd) {
	s.loads.Reports.Inc()
	refused := l.rep.Load().Report(req.GetClusterStats())
	if !refused.Any() || l.told {
		return
	}
	l.told = true
	s.log.Warn("stats in a client's load report left out (counted in xdsrelay_lrs_dropped_stats_total; later ones from this stream are not logged)",
		append(end.attrs(ctx), "max_names", refused.MaxNames, "invalid_value", refused.InvalidValues)...)
}
