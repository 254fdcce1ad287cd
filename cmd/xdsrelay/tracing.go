package main

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
	"go.opentelemetry.io/otel/trace"
)

// TracingOptions are the tracing.* keys.
type TracingOptions struct {
	Endpoint    string  // tracing.otlp_endpoint: OTLP/gRPC collector host:port; empty disables
	Insecure    bool    // tracing.insecure: plaintext to the collector
	SampleRatio float64 // tracing.sample_ratio: fraction of new traces kept
}

// setupTracing installs the global tracer provider exporting over OTLP/gRPC.
// The returned function flushes and stops it.
func setupTracing(ctx context.Context, o TracingOptions) (func(context.Context) error, error) {
	opts := []otlptracegrpc.Option{otlptracegrpc.WithEndpoint(o.Endpoint)}
	if o.Insecure {
		opts = append(opts, otlptracegrpc.WithInsecure())
	}
	exp, err := otlptracegrpc.New(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("tracing.otlp_endpoint: %w", err)
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithSampler(linkedSampler{sdktrace.ParentBased(sdktrace.TraceIDRatioBased(o.SampleRatio))}),
		sdktrace.WithResource(resource.NewSchemaless(semconv.ServiceName("xdsrelay"), semconv.ServiceVersion(currentVersion().Version))),
	)
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.TraceContext{})
	return tp.Shutdown, nil
}

// linkedSampler keeps a span that links to a sampled span, and otherwise
// asks next: a downstream.push is its own root, linked to the
// upstream.receive it carries, and is kept whenever that update was, not
// at the ratio again.
type linkedSampler struct{ next sdktrace.Sampler }

func (s linkedSampler) ShouldSample(p sdktrace.SamplingParameters) sdktrace.SamplingResult {
	for _, l := range p.Links {
		if l.SpanContext.IsSampled() {
			return sdktrace.SamplingResult{Decision: sdktrace.RecordAndSample,
				Tracestate: trace.SpanContextFromContext(p.ParentContext).TraceState()}
		}
	}
	return s.next.ShouldSample(p)
}

func (s linkedSampler) Description() string { return "LinkedOr{" + s.next.Description() + "}" }
