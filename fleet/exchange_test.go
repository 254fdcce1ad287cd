package fleet

import (
	"context"
	"math"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
)

type answerFunc func(context.Context, Report) (Report, error)

func (f answerFunc) Exchange(ctx context.Context, r Report) (Report, error) { return f(ctx, r) }

// serveExchange serves a on a real gRPC server on 127.0.0.1:0 and returns
// a connection to it.
func serveExchange(t *testing.T, a Answerer) *grpc.ClientConn {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	srv.RegisterService(&ServiceDesc, a)
	served := make(chan struct{})
	go func() {
		defer close(served)
		srv.Serve(ln)
	}()
	t.Cleanup(func() {
		srv.Stop()
		<-served
	})
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// The exchange carries each side's report over a real gRPC call, and a
// caller the answerer refuses gets its status.
func TestExchangeOverGRPC(t *testing.T) {
	var heard Report
	conn := serveExchange(t, answerFunc(func(ctx context.Context, caller Report) (Report, error) {
		if caller.Self == "10.9.9.9:1" {
			return Report{}, status.Error(codes.PermissionDenied, "not a peer")
		}
		heard = caller
		return Report{Self: "10.0.0.2:18001", Clients: 42, View: []string{"10.0.0.2:18001", "10.0.0.1:18001"}}, nil
	}))
	got, err := Ask(ctxFor(t), conn, Report{Self: "10.0.0.1:18001", Clients: 7, View: []string{"10.0.0.1:18001"}})
	if err != nil {
		t.Fatal(err)
	}
	if got.Self != "10.0.0.2:18001" || got.Clients != 42 || !slices.Equal(got.View, []string{"10.0.0.1:18001", "10.0.0.2:18001"}) {
		t.Fatalf("got %+v", got)
	}
	if heard.Self != "10.0.0.1:18001" || heard.Clients != 7 {
		t.Fatalf("the answerer heard %+v", heard)
	}
	_, err = Ask(ctxFor(t), conn, Report{Self: "10.9.9.9:1"})
	if status.Code(err) != codes.PermissionDenied {
		t.Fatalf("want PermissionDenied, got %v", err)
	}
}

// A report from the wire is bounded: a count that is not one, a view past
// its bound or a text past its length is refused.
func TestReportFromTheWireIsBounded(t *testing.T) {
	long := strings.Repeat("a", maxReportText+1)
	many := make([]any, maxReportView+1)
	for i := range many {
		many[i] = "m"
	}
	for name, fields := range map[string]map[string]any{
		"NaN clients":      {"clients": math.NaN()},
		"negative clients": {"clients": -1.0},
		"huge clients":     {"clients": 1e300},
		"long self":        {"self": long},
		"long member":      {"view": []any{long}},
		"empty member":     {"view": []any{""}},
		"many members":     {"view": many},
	} {
		s, err := structpb.NewStruct(fields)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := decodeReport(s); err == nil {
			t.Errorf("%s: decoded", name)
		}
	}
	s, _ := structpb.NewStruct(map[string]any{"clients": 3.0, "view": []any{"b", "a", "b"}})
	r, err := decodeReport(s)
	if err != nil || r.Clients != 3 || !slices.Equal(r.View, []string{"a", "b"}) {
		t.Fatalf("got %+v, %v", r, err)
	}
}
