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
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(o.SampleRatio))),
		sdktrace.WithResource(resource.NewSchemaless(semconv.ServiceName("xdsrelay"), semconv.ServiceVersion(currentVersion().Version))),
	)
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.TraceContext{})
	return tp.Shutdown, nil
}
