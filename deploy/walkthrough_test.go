package deploy

import (
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
)

// tcpForward is a TCP proxy on 127.0.0.1 to backend, dialled from source
// (nil: the system's choice), until the test ends. kubectl port-forward
// is one: the container runtime dials the pod's localhost:PORT from
// inside the pod. A sidecar that forwards inbound connections is another,
// from its own address (Istio's: 127.0.0.6).
func tcpForward(t *testing.T, source net.IP, backend string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	d := net.Dialer{Timeout: wait}
	if source != nil {
		d.LocalAddr = &net.TCPAddr{IP: source}
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	track := func(cs ...net.Conn) {
		mu.Lock()
		defer mu.Unlock()
		conns = append(conns, cs...)
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			b, err := d.Dial("tcp", backend)
			if err != nil {
				c.Close()
				continue
			}
			track(c, b)
			wg.Add(2)
			go func() { defer wg.Done(); _, _ = io.Copy(b, c); b.Close() }()
			go func() { defer wg.Done(); _, _ = io.Copy(c, b); c.Close() }()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

// docSection is the text of a "## title" section of doc.
func docSection(t *testing.T, doc, title string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", doc))
	if err != nil {
		t.Fatal(err)
	}
	_, text, ok := strings.Cut(string(b), "\n## "+title+"\n")
	if !ok {
		t.Fatalf("%s: no section %q", doc, title)
	}
	if i := strings.Index(text, "\n## "); i >= 0 {
		text = text[:i]
	}
	return text
}

// textBlocks are the ```text blocks of a section, in order, each as its
// lines.
func textBlocks(section string) [][]string {
	var out [][]string
	for _, blk := range strings.Split(section, "```text\n")[1:] {
		code, _, _ := strings.Cut(blk, "```")
		out = append(out, strings.Split(strings.TrimSpace(code), "\n"))
	}
	return out
}

const walkthrough = "Walk-through: a relay in a cluster, from a laptop"

// docs/operations.md's walk-through, and docs/kubernetes.md's commands
// without a certificate, run as written against each install booted as
// its pod runs: `kubectl port-forward` is a TCP proxy on loopback to the
// pod's admin.local_address, `kubectl exec` runs the binary in the pod,
// where it reaches that listener itself. With no certificate anywhere,
// status --summary, config-dump and wait answer, a release is refused
// (403, exit 1), and so are the views on the admin port, through a
// sidecar-like proxy (from 127.0.0.6) and with a proxy's headers.
func TestAdminViewsThroughPortForward(t *testing.T) {
	for _, tc := range []struct {
		m      manifests
		secret bool
	}{
		{m: renderKustomize(t, ".")},
		{m: renderChart(t, chartRelease, chartNamespace, nil)},
		{m: renderKustomize(t, "overlays/admin-mtls"), secret: true},
	} {
		t.Run(tc.m.source, func(t *testing.T) {
			secretDir := ""
			if tc.secret {
				secretDir = makeAdminPKI(t, tc.m.service.Name+"."+chartNamespace+".svc").secretDir
			}
			cp := startControlPlane(t)
			p := bootInstall(t, tc.m, secretDir, upstreamEnv+"="+cp.addr)
			p.waitReady(t)
			if p.adminLocal == "" {
				t.Fatal("the install opened no admin.local_address")
			}
			// envoy-1 holds the Cluster app, and ACKs it.
			client := dialClient(t, p.downstream)
			client.send(t, subscribe("envoy-1", "fleet", []string{"app"}))
			up := cp.stream(t)
			up.recv(t)
			up.send(t, &discoverypb.DeltaDiscoveryResponse{TypeUrl: clusterType, Nonce: "1", Resources: []*discoverypb.Resource{cluster(t, "app", "1", 1)}})
			client.send(t, ack(recvOK(t, client)))

			forwarded := ""
			run := func(doc, line string) (int, string, string) {
				t.Helper()
				words := strings.Fields(strings.TrimSuffix(line, "&"))
				switch {
				case len(words) > 3 && words[0] == "kubectl" && words[3] == "port-forward":
					if words[len(words)-1] != "9902" {
						t.Fatalf("%s: %q forwards another port than admin.local_address's", doc, line)
					}
					forwarded = tcpForward(t, nil, p.adminLocal)
					return 0, "", ""
				case len(words) > 3 && words[0] == "kubectl" && words[3] == "exec":
					i := indexOf(words, "--")
					if i < 0 || words[i+1] != "/xdsrelay" {
						t.Fatalf("%s: %q runs no /xdsrelay in the pod", doc, line)
					}
					args := replaceAll(words[i+2:], "127.0.0.1:9902", p.adminLocal)
					return cli(t, args...)
				case words[0] == "xdsrelay":
					if forwarded == "" {
						t.Fatalf("%s: %q before the port is forwarded", doc, line)
					}
					return cli(t, replaceAll(words[1:], "localhost:9902", forwarded)...)
				}
				t.Fatalf("%s: %q is not a command this walk-through knows", doc, line)
				return 0, "", ""
			}

			section := docSection(t, "docs/operations.md", walkthrough)
			shown := textBlocks(section)
			if len(shown) != 2 {
				t.Fatalf("the walk-through shows %d outputs, want config-dump's and wait's", len(shown))
			}
			for _, line := range docCommands(t, "docs/operations.md", walkthrough) {
				code, out, errOut := run("docs/operations.md", line)
				var want []string
				wantCode := 0
				switch {
				case strings.Contains(line, "config-dump") && strings.Contains(line, "localhost:9902"):
					want = shown[0]
				case strings.Contains(line, "xdsrelay wait"):
					want = shown[1]
				case strings.Contains(line, "guard release"):
					wantCode, want = 1, nil
					if !strings.Contains(errOut, "403 Forbidden") || !strings.Contains(errOut, "not on admin.local_address") {
						t.Errorf("%q: %q, want 403 saying releases are not served there", line, errOut)
					}
				}
				if code != wantCode {
					t.Errorf("%q: exit %d, want %d: %q %q", line, code, wantCode, out, errOut)
				}
				for _, w := range want {
					if !strings.Contains(out, strings.TrimSpace(w)) {
						t.Errorf("%q printed %q; the walk-through shows %q", line, out, w)
					}
				}
			}
			if !strings.Contains(section, "kubectl -n mesh exec") {
				t.Error("the walk-through runs nothing through kubectl exec")
			}
			ran := 0
			for _, line := range docCommands(t, "docs/kubernetes.md", "Kubernetes") {
				if strings.Contains(line, "9902") && !strings.Contains(line, "--cert-file") {
					if code, out, errOut := run("docs/kubernetes.md", line); code != 0 {
						t.Errorf("docs/kubernetes.md's %q: exit %d, %q %q", line, code, out, errOut)
					}
					ran++
				}
			}
			if ran < 2 {
				t.Errorf("docs/kubernetes.md shows %d commands for the views without a certificate, want the port-forward and a command", ran)
			}

			// Nothing of it on the admin port, through a sidecar, or with
			// a proxy's headers.
			if code, _, err := p.get("/debug/groups"); err != nil || code != http.StatusForbidden {
				t.Errorf("/debug/groups on the admin port without a certificate: %d %v, want 403", code, err)
			}
			sidecar := tcpForward(t, net.IPv4(127, 0, 0, 6), p.adminLocal)
			if code, _, errOut := cli(t, "config-dump", "--admin", sidecar, "--node", "envoy-1"); code != 1 || !strings.Contains(errOut, "127.0.0.6") {
				t.Errorf("config-dump through a sidecar forwarding from 127.0.0.6: exit %d, %q, want 1 and 403 naming it", code, errOut)
			}
			req, err := http.NewRequest(http.MethodGet, "http://"+forwarded+"/debug/groups", nil)
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("X-Forwarded-Proto", "http") // Envoy sets it on all it forwards
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusForbidden {
				t.Errorf("/debug/groups with X-Forwarded-Proto: %d, want 403", resp.StatusCode)
			}
		})
	}
}

func indexOf(words []string, w string) int {
	for i, x := range words {
		if x == w {
			return i
		}
	}
	return -1
}

// replaceAll is words with every one equal to from replaced by to.
func replaceAll(words []string, from, to string) []string {
	out := make([]string, len(words))
	for i, w := range words {
		out[i] = w
		if w == from {
			out[i] = to
		}
	}
	return out
}
