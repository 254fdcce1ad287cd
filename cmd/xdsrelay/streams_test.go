package main

import (
	"context"
	"testing"
	"time"

	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// deltaADS opens a delta ADS stream to the relay at addr; it ends after
// wait, or with the test.
func deltaADS(t *testing.T, addr string, wait time.Duration) discoverypb.AggregatedDiscoveryService_DeltaAggregatedResourcesClient {
	t.Helper()
	ctx, ads := adsService(t, addr, wait)
	st, err := ads.DeltaAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// sotwADS opens a state-of-the-world ADS stream to the relay at addr; it
// ends after wait, or with the test.
func sotwADS(t *testing.T, addr string, wait time.Duration) discoverypb.AggregatedDiscoveryService_StreamAggregatedResourcesClient {
	t.Helper()
	ctx, ads := adsService(t, addr, wait)
	st, err := ads.StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// adsService dials addr and returns a context bounded by wait; both are
// closed when the test ends.
func adsService(t *testing.T, addr string, wait time.Duration) (context.Context, discoverypb.AggregatedDiscoveryServiceClient) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	t.Cleanup(cancel)
	return ctx, discoverypb.NewAggregatedDiscoveryServiceClient(conn)
}
