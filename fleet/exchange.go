package fleet

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/structpb"
)

// The exchange is how members learn of each other, on the xDS port (with
// the downstream TLS): every member asks every other, every probe period,
// and the answer is the other's Report. An answer is the proof that the
// member is alive; its client count is what balance reads, and its view
// what the disagreement count compares. One unary call a member pair and
// period: it reaches every member whatever groups the two share, which
// the peer streams (only between a member and the owners of its clients'
// groups) would not.

// ExchangeMethod is the exchange's full gRPC method name.
const ExchangeMethod = "/xdsrelay.fleet.v1.Fleet/Exchange"

// Report is what a member says of itself.
type Report struct {
	Self string // its fleet.self, as the others know it
	// Instance is the member's process, a random id drawn as it starts:
	// a member that is answered by its own instance has dialled itself
	// (its fleet.self is not the address it is reached at).
	Instance string
	// Config is what of its configuration the members must share
	// (Options.Config's fingerprint): the groups' keys and the control
	// planes. Members that differ fetch and group differently.
	Config  string
	Clients int      // the clients it holds
	View    []string // the members it sees (itself included), sorted
}

// Bounds on a report read from the wire: a member is a peer, and what it
// says is bounded as anything from a peer.
const (
	maxReportText  = 256
	maxReportView  = 1024
	maxReportCount = 1 << 30
)

// Answerer answers the exchange on a server: it is given the caller's
// report and returns its own, or a gRPC status error (an untrusted
// caller).
type Answerer interface {
	Exchange(ctx context.Context, caller Report) (Report, error)
}

// ServiceDesc is the exchange as a gRPC service, for RegisterService with
// an Answerer.
var ServiceDesc = grpc.ServiceDesc{
	ServiceName: "xdsrelay.fleet.v1.Fleet",
	HandlerType: (*Answerer)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Exchange",
		Handler:    exchangeHandler,
	}},
	Metadata: "xdsrelay/fleet",
}

func exchangeHandler(srv any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
	in := &structpb.Struct{}
	if err := dec(in); err != nil {
		return nil, err
	}
	caller, err := decodeReport(in)
	if err != nil {
		return nil, err
	}
	mine, err := srv.(Answerer).Exchange(ctx, caller)
	if err != nil {
		return nil, err
	}
	return encodeReport(mine), nil
}

// Ask makes the exchange over conn: mine goes, the other's comes back.
func Ask(ctx context.Context, conn grpc.ClientConnInterface, mine Report) (Report, error) {
	out := &structpb.Struct{}
	if err := conn.Invoke(ctx, ExchangeMethod, encodeReport(mine), out); err != nil {
		return Report{}, err
	}
	return decodeReport(out)
}

func encodeReport(r Report) *structpb.Struct {
	view := make([]any, len(r.View))
	for i, m := range r.View {
		view[i] = m
	}
	s, err := structpb.NewStruct(map[string]any{"self": r.Self, "instance": r.Instance, "config": r.Config, "clients": float64(r.Clients), "view": view})
	if err != nil {
		panic(fmt.Sprintf("fleet: a report of strings and a number does not encode: %v", err)) // unreachable
	}
	return s
}

// decodeReport reads a report from the wire, within the bounds.
func decodeReport(s *structpb.Struct) (Report, error) {
	f := s.GetFields()
	r := Report{Self: f["self"].GetStringValue()}
	r.Instance, r.Config = f["instance"].GetStringValue(), f["config"].GetStringValue()
	if len(r.Self) > maxReportText || len(r.Instance) > maxReportText || len(r.Config) > maxReportText {
		return Report{}, errors.New("fleet: a report's self, instance or config is too long")
	}
	n := f["clients"].GetNumberValue()
	if math.IsNaN(n) || n < 0 || n > maxReportCount {
		return Report{}, fmt.Errorf("fleet: a report's clients %v is not a count", n)
	}
	r.Clients = int(n)
	view := f["view"].GetListValue().GetValues()
	if len(view) > maxReportView {
		return Report{}, fmt.Errorf("fleet: a report's view of %d members is past %d", len(view), maxReportView)
	}
	for _, v := range view {
		m := v.GetStringValue()
		if m == "" || len(m) > maxReportText {
			return Report{}, errors.New("fleet: a report's view names an empty or too long member")
		}
		r.View = append(r.View, m)
	}
	slices.Sort(r.View)
	r.View = slices.Compact(r.View)
	return r, nil
}
