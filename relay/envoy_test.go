package relay

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerpb "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routerpb "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmpb "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/xdsrelay/xdsrelay/internal/testcp"
)

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// httpListener is an Envoy listener on port whose routes come from RDS.
func httpListener(name string, port int, route string) *listenerpb.Listener {
	router, _ := anypb.New(&routerpb.Router{})
	hcm, _ := anypb.New(&hcmpb.HttpConnectionManager{
		StatPrefix: name,
		RouteSpecifier: &hcmpb.HttpConnectionManager_Rds{Rds: &hcmpb.Rds{RouteConfigName: route, ConfigSource: &corepb.ConfigSource{
			ResourceApiVersion: corepb.ApiVersion_V3, ConfigSourceSpecifier: &corepb.ConfigSource_Ads{Ads: &corepb.AggregatedConfigSource{}},
		}}},
		HttpFilters: []*hcmpb.HttpFilter{{Name: "router", ConfigType: &hcmpb.HttpFilter_TypedConfig{TypedConfig: router}}},
	})
	return &listenerpb.Listener{
		Name: name,
		Address: &corepb.Address{Address: &corepb.Address_SocketAddress{SocketAddress: &corepb.SocketAddress{
			Address: "127.0.0.1", PortSpecifier: &corepb.SocketAddress_PortValue{PortValue: uint32(port)},
		}}},
		FilterChains: []*listenerpb.FilterChain{{Filters: []*listenerpb.Filter{{
			Name: "http", ConfigType: &listenerpb.Filter_TypedConfig{TypedConfig: hcm},
		}}}},
	}
}

const envoyBootstrap = `node: {id: envoy-1, cluster: c1}
admin: {address: {socket_address: {address: 127.0.0.1, port_value: %d}}}
dynamic_resources:
  ads_config:
    api_type: %s
    transport_api_version: V3
    grpc_services: [{envoy_grpc: {cluster_name: xdsrelay}}]
  cds_config: {ads: {}, resource_api_version: V3}
  lds_config: {ads: {}, resource_api_version: V3}
static_resources:
  clusters:
  - name: xdsrelay
    type: STATIC
    connect_timeout: 1s
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {http2_protocol_options: {}}
    load_assignment:
      cluster_name: xdsrelay
      endpoints: [{lb_endpoints: [{endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: %d}}}}]}]
`

// Real Envoy, configured through the relay over SotW and incremental ADS
// (wildcard LDS and CDS, named RDS and EDS), carries HTTP traffic to a
// backend. Runs when ENVOY_BIN names an Envoy binary.
func TestEnvoyThroughRelay(t *testing.T) {
	bin := os.Getenv("ENVOY_BIN")
	if bin == "" {
		t.Skip("ENVOY_BIN is not set: no Envoy binary to run against the relay")
	}
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, "hello from the backend")
	}))
	defer backend.Close()
	for _, apiType := range []string{"GRPC", "DELTA_GRPC"} {
		t.Run(apiType, func(t *testing.T) {
			cp := testcp.Start(t)
			port := freePort(t)
			cp.Set(t, "c1", "1", httpListener("http", port, "r"), testcp.Route("r", "backend"),
				testcp.Cluster("backend"), testcp.Endpoints("backend", strings.TrimPrefix(backend.URL, "http://")))
			r := startRelay(t, cp.Addr)
			_, relayPort, _ := net.SplitHostPort(r.Addr())
			var rp int
			fmt.Sscan(relayPort, &rp)
			boot := filepath.Join(t.TempDir(), "envoy.yaml")
			os.WriteFile(boot, []byte(fmt.Sprintf(envoyBootstrap, freePort(t), apiType, rp)), 0o600)
			cmd := exec.Command(bin, "-c", boot, "--disable-hot-restart", "--concurrency", "1", "--log-level", "warn")
			cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer func() { cmd.Process.Kill(); cmd.Wait() }()
			deadline := time.Now().Add(30 * time.Second)
			for {
				resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/", port))
				if err == nil {
					body, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					if string(body) == "hello from the backend" {
						return
					}
				}
				if time.Now().After(deadline) {
					t.Fatalf("no traffic through Envoy: last error %v", err)
				}
				time.Sleep(100 * time.Millisecond)
			}
		})
	}
}
