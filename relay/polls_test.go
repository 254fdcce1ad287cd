package relay

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	clustersvc "github.com/envoyproxy/go-control-plane/envoy/service/cluster/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/xdsrelay/xdsrelay/internal/testcp"
)

// restPoll posts req to url and returns the answer's status and body.
func restPoll(t *testing.T, url string, req *discoverypb.DiscoveryRequest) (int, string) {
	t.Helper()
	body, err := protojson.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Post(url, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// limits.max_polls: while one poll is held (its version_info is current),
// a second one, REST-JSON or gRPC Fetch, is refused naming the key and
// counted; once the held poll is answered, polls are admitted again.
func TestMaxPolls(t *testing.T) {
	cp := testcp.Start(t)
	cp.Set(t, "c1", "1", testcp.Cluster("x"))
	r := startRelay(t, cp.Addr, func(c *Config) {
		c.Downstream.RESTAddress = "127.0.0.1:0"
		c.Downstream.PollTimeout = wait
		c.Limits.MaxPolls = 1
	})
	url := "http://" + r.RESTAddr() + "/v3/discovery:clusters"
	cds := clustersvc.NewClusterDiscoveryServiceClient(dial(t, r.Addr()))
	fetch := func(req *discoverypb.DiscoveryRequest) (*discoverypb.DiscoveryResponse, error) {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		return cds.FetchClusters(ctx, req)
	}
	first, err := fetch(&discoverypb.DiscoveryRequest{Node: node("poller", "c1")})
	if err != nil {
		t.Fatal(err)
	}
	current := &discoverypb.DiscoveryRequest{Node: node("poller", "c1"), VersionInfo: first.GetVersionInfo()}
	refusals, polls := 0, 1
	for i, hold := range []struct {
		name string
		poll func() string // held until the control plane changes; says how it was answered
	}{
		{"REST-JSON", func() string {
			code, body := restPoll(t, url, current)
			return fmt.Sprint(code, " ", body)
		}},
		{"gRPC Fetch", func() string {
			resp, err := fetch(current)
			if err != nil {
				return err.Error()
			}
			return "200 " + protojson.Format(resp)
		}},
	} {
		t.Run("held "+hold.name, func(t *testing.T) {
			answer := make(chan string, 1)
			go func() { answer <- hold.poll() }()
			polls++
			waitMetric(t, r, fmt.Sprintf(`xdsrelay_downstream_requests_total{type="Cluster"} %d`, polls)) // held

			code, body := restPoll(t, url, current)
			if code != http.StatusTooManyRequests || !strings.Contains(body, "xdsrelay: limits.max_polls (1) reached") {
				t.Errorf("REST-JSON poll beside a held one: %d %q, want 429 naming limits.max_polls", code, body)
			}
			_, err := fetch(current)
			wantRefused(t, err, "limits.max_polls")
			refusals += 2
			waitMetric(t, r, fmt.Sprintf(`xdsrelay_limit_refusals_total{limit="max_polls"} %d`, refusals))

			cp.Set(t, "c1", fmt.Sprint(i+2), testcp.Cluster("x"), testcp.Cluster(fmt.Sprint("y", i)))
			select {
			case a := <-answer:
				if !strings.HasPrefix(a, "200 ") || !strings.Contains(a, fmt.Sprint("y", i)) {
					t.Fatalf("held poll: %s, want the change", a)
				}
			case <-time.After(wait):
				t.Fatal("the held poll was not answered")
			}
			resp, err := fetch(&discoverypb.DiscoveryRequest{Node: node("poller", "c1")})
			if err != nil {
				t.Fatalf("a poll once the held one was answered: %v", err)
			}
			polls++
			current.VersionInfo = resp.GetVersionInfo()
		})
	}
}

// A REST-JSON path the relay does not serve is answered 404 with the
// paths it does, and one of those asked with GET 405 naming POST, each
// marked as the REST-JSON port's answer (RESTListenerHeader).
func TestRESTUnknownPath(t *testing.T) {
	cp := testcp.Start(t)
	r := startRelay(t, cp.Addr, func(c *Config) { c.Downstream.RESTAddress = "127.0.0.1:0" })
	base := "http://" + r.RESTAddr()
	code, body := restPoll(t, base+"/v3/discovery:bogus", &discoverypb.DiscoveryRequest{Node: node("poller", "c1")})
	if code != http.StatusNotFound || !strings.Contains(body, "no REST-JSON path /v3/discovery:bogus") || !strings.Contains(body, "/v3/discovery:clusters") {
		t.Errorf("POST /v3/discovery:bogus: %d %q; want 404 naming the paths there are", code, body)
	}
	resp, err := http.Get(base + "/v3/discovery:clusters")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != http.MethodPost || !strings.Contains(string(b), "polled with POST") ||
		resp.Header.Get(RESTListenerHeader) != RESTListener {
		t.Errorf("GET /v3/discovery:clusters: %d %q %v; want 405, POST", resp.StatusCode, b, resp.Header)
	}
}
