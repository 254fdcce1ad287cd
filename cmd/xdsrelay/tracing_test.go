package main

import (
	"context"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// A span linked to a sampled span is kept whatever the ratio: a push
// follows the update it carries. Other spans are sampled at the ratio.
func TestLinkedSampler(t *testing.T) {
	s := linkedSampler{sdktrace.ParentBased(sdktrace.TraceIDRatioBased(0))}
	link := func(flags trace.TraceFlags) []trace.Link {
		return []trace.Link{{SpanContext: trace.NewSpanContext(trace.SpanContextConfig{
			TraceID: trace.TraceID{1}, SpanID: trace.SpanID{2}, TraceFlags: flags})}}
	}
	for _, tc := range []struct {
		name  string
		links []trace.Link
		want  sdktrace.SamplingDecision
	}{
		{"no link", nil, sdktrace.Drop},
		{"linked to a sampled span", link(trace.FlagsSampled), sdktrace.RecordAndSample},
		{"linked to a span not sampled", link(0), sdktrace.Drop},
	} {
		got := s.ShouldSample(sdktrace.SamplingParameters{ParentContext: context.Background(), TraceID: trace.TraceID{9},
			Name: "downstream.push", Links: tc.links}).Decision
		if got != tc.want {
			t.Errorf("%s: decision %v, want %v", tc.name, got, tc.want)
		}
	}
}
