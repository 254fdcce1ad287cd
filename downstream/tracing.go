package downstream

import (
	"context"
	"strconv"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/xdsrelay/xdsrelay/cache"
	"github.com/xdsrelay/xdsrelay/internal/xds"
)

// tracerName names the downstream's spans; the tracer is looked up from the
// global provider at use, so that a provider installed later is used.
const tracerName = "github.com/xdsrelay/xdsrelay/downstream"

// tracePush records a response written to the client as a downstream.push
// span linked to the upstream.receive span of the response that last
// changed the type (tr): a link, not a child, since pushes happen later, on
// the send workers. Only when that span was sampled: with tracing
// off tr is zero and this costs a comparison.
func (b *streamBase) tracePush(tr cache.Trace, typeURL string, version uint64, resources int) {
	if !tr.Sampled {
		return
	}
	from := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tr.TraceID, SpanID: tr.SpanID,
		TraceFlags: trace.FlagsSampled})
	_, span := otel.Tracer(tracerName).Start(context.Background(), "downstream.push", trace.WithNewRoot(),
		trace.WithSpanKind(trace.SpanKindProducer), trace.WithLinks(trace.Link{SpanContext: from}),
		trace.WithAttributes(attribute.String("xds.type", xds.ShortName(typeURL)), attribute.String("xds.variant", b.variant),
			attribute.String("xds.version", strconv.FormatUint(version, 10)), attribute.String("xds.node", xds.Clip(b.node.GetId())),
			attribute.Int("xds.resources", resources)))
	span.End()
}
