package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/protobuf/encoding/protojson"
)

// shellWords reads one command as a shell would: lines joined at a
// trailing backslash, words split on blanks, single quotes kept whole.
func shellWords(t *testing.T, cmd string) []string {
	t.Helper()
	cmd = strings.ReplaceAll(cmd, "\\\n", " ")
	var words []string
	for len(cmd) > 0 {
		cmd = strings.TrimLeft(cmd, " \t\n")
		if cmd == "" {
			break
		}
		if cmd[0] == '\'' {
			end := strings.IndexByte(cmd[1:], '\'')
			if end < 0 {
				t.Fatalf("unterminated quote in %q", cmd)
			}
			words, cmd = append(words, cmd[1:end+1]), cmd[end+2:]
			continue
		}
		end := strings.IndexAny(cmd, " \t\n")
		if end < 0 {
			end = len(cmd)
		}
		words, cmd = append(words, cmd[:end]), cmd[end:]
	}
	return words
}

// shellCommand is one command of a shell block: its environment
// assignments, its words, and whether it runs in the background (&).
type shellCommand struct {
	env        map[string]string
	words      []string
	background bool
}

// shellCommands returns the commands of a shell block, one a line after
// the lines are joined at a trailing backslash.
func shellCommands(t *testing.T, block string) []shellCommand {
	t.Helper()
	var out []shellCommand
	for _, line := range strings.Split(strings.ReplaceAll(block, "\\\n", " "), "\n") {
		words := shellWords(t, line)
		if len(words) == 0 || strings.HasPrefix(words[0], "#") {
			continue
		}
		c := shellCommand{env: map[string]string{}}
		if words[len(words)-1] == "&" {
			c.background, words = true, words[:len(words)-1]
		}
		for len(words) > 0 && envAssignment.MatchString(words[0]) {
			k, v, _ := strings.Cut(words[0], "=")
			c.env[k], words = v, words[1:]
		}
		c.words = words
		out = append(out, c)
	}
	return out
}

var envAssignment = regexp.MustCompile(`^[A-Z_][A-Z0-9_]*=`)

// relayArgs returns the arguments of a `go run ./cmd/xdsrelay ...` command,
// with the quick start's xDS address moved to addr.
func relayArgs(t *testing.T, c shellCommand, addr string) []string {
	t.Helper()
	if len(c.words) < 3 || strings.Join(c.words[:3], " ") != "go run ./cmd/xdsrelay" {
		t.Fatalf("not a go run ./cmd/xdsrelay command: %q", c.words)
	}
	args := slices.Clone(c.words[3:])
	for i, a := range args {
		if a == "localhost:18001" {
			args[i] = addr
		}
	}
	return args
}

// The README's first client, `xdsrelay watch`, run as written against the
// relay of the quick start (only its port moved), prints the lines the
// README shows it printing; and `xdsrelay status`, run while it watches,
// prints the header and the row the README shows, but for the version.
func TestReadmeWatchAndStatus(t *testing.T) {
	r := bootReadme(t, func(_, content string) string { return content })

	watch := shellCommands(t, docBlock(t, "README.md", "sh", " watch "))
	if len(watch) != 1 {
		t.Fatalf("the README's watch block: %d commands", len(watch))
	}
	out := &syncBuffer{}
	stop := runAsync(t, out, relayArgs(t, watch[0], r.Addr())...)
	shown := docBlock(t, "README.md", "text", "name: greeter-cluster")
	for _, line := range strings.Split(shown, "\n") {
		if line = strings.TrimSpace(line); line == "" || strings.HasPrefix(line, "versionInfo:") {
			continue // the version is the resource files'
		}
		waitForOutput(t, out, "(?m)^ *"+regexp.QuoteMeta(line)+"$")
	}

	status := shellCommands(t, docBlock(t, "README.md", "sh", " status "))
	if len(status) != 1 {
		t.Fatalf("the README's status block: %d commands", len(status))
	}
	want := strings.Split(strings.TrimSpace(docBlock(t, "README.md", "text", "STATUS")), "\n")
	// The README says a REST poll of the same resources answers the status
	// version whole: its two examples agree (TestStatusShortVersions holds
	// the relay to it).
	rest := regexp.MustCompile(`"versionInfo":"([0-9a-f]+)"`).FindStringSubmatch(docBlock(t, "README.md", "text", `"versionInfo"`))
	if f := strings.Fields(want[len(want)-1]); len(rest) != 2 || len(f) < 4 || !strings.HasPrefix(rest[1], f[3]) {
		t.Errorf("the README's status version %q does not begin its REST version_info %q", f, rest)
	}
	eventually(t, func() string { // the watch's ACK may still be on its way
		code, got, errOut := runCLI(relayArgs(t, status[0], r.Addr())...)
		lines := strings.Split(strings.TrimSpace(got), "\n")
		if code == 0 && len(lines) == len(want) && lines[0] == want[0] && sameRowButVersion(lines[1], want[1]) {
			return ""
		}
		return fmt.Sprintf("xdsrelay status: exit %d, %q %q; the README shows %q", code, got, errOut, want)
	})
	if c := stop(); c != 0 {
		t.Fatalf("watch: exit %d, want 0", c)
	}
}

// sameRowButVersion reports whether two rows of `xdsrelay status` agree in
// every column but the fourth, the version.
func sameRowButVersion(a, b string) bool {
	fa, fb := strings.Fields(a), strings.Fields(b)
	if len(fa) != len(fb) || len(fa) < 4 {
		return false
	}
	fa[3], fb[3] = "", ""
	return slices.Equal(fa, fb)
}

// The README's gRPC example works as written: the relay of the quick start,
// `go run ./examples/greeter/server` (listening on a free port, where a
// copy of greeter.yaml then points), and the client with the
// GRPC_XDS_BOOTSTRAP the README sets (its server_uri moved to the relay's
// port) dialing xds:///greeter through gRPC's own xDS resolver: it prints
// what the README shows.
func TestReadmeGreeterExample(t *testing.T) {
	cmds := shellCommands(t, docBlock(t, "README.md", "sh", "examples/greeter/client"))
	if len(cmds) != 2 || !cmds[0].background || cmds[1].background {
		t.Fatalf("the README's gRPC example: want the server in the background, then the client: %+v", cmds)
	}
	var pkgs []string
	for _, c := range cmds {
		if len(c.words) < 3 || c.words[0] != "go" || c.words[1] != "run" {
			t.Fatalf("not a go run command: %q", c.words)
		}
		pkgs = append(pkgs, c.words[2])
	}
	bin := buildExamples(t, pkgs...)
	port := freePort(t)
	r := bootReadme(t, moveGreeter(t, port))

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var serverOut bytes.Buffer
	serverArgs := append(slices.Clone(cmds[0].words[3:]), "-addr", fmt.Sprintf("127.0.0.1:%d", port))
	server := exec.CommandContext(ctx, filepath.Join(bin, filepath.Base(pkgs[0])), serverArgs...)
	server.Stdout, server.Stderr = &serverOut, &serverOut
	if err := server.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		server.Process.Kill()
		server.Wait()
	}()

	bootstrapFile := cmds[1].env["GRPC_XDS_BOOTSTRAP"]
	if bootstrapFile == "" {
		t.Fatal("the README's client runs without GRPC_XDS_BOOTSTRAP")
	}
	var bootstrap map[string]any
	b, err := os.ReadFile(filepath.Join(repo, bootstrapFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &bootstrap); err != nil {
		t.Fatalf("%s: %v", bootstrapFile, err)
	}
	servers := bootstrap["xds_servers"].([]any)
	if got := servers[0].(map[string]any)["server_uri"]; got != "localhost:18001" {
		t.Fatalf("%s names %v, not the relay of the quick start (localhost:18001)", bootstrapFile, got)
	}
	servers[0].(map[string]any)["server_uri"] = r.Addr()
	if b, err = json.Marshal(bootstrap); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "bootstrap.json")
	if err := os.WriteFile(file, b, 0o600); err != nil {
		t.Fatal(err)
	}

	client := exec.CommandContext(ctx, filepath.Join(bin, filepath.Base(pkgs[1])), cmds[1].words[3:]...)
	client.Env = append(os.Environ(), "GRPC_XDS_BOOTSTRAP="+file)
	out, err := client.CombinedOutput()
	if err != nil {
		t.Fatalf("client: %v\n%s\nserver:\n%s", err, out, serverOut.String())
	}
	want := strings.TrimSpace(docBlock(t, "README.md", "text", "xds:///greeter answered by"))
	if !strings.Contains(string(out), want) {
		t.Fatalf("client printed %q, the README shows %q", out, want)
	}
}

// The README's REST-JSON example works as written: the relay started with
// the environment the README sets (the REST address moved to a free
// port), and its curl command, run with curl when there is one (else the
// same request made here: the method, headers and body curl would send),
// answers the cluster the README shows.
func TestReadmeCurl(t *testing.T) {
	cmds := append(shellCommands(t, docBlock(t, "README.md", "sh", "XDSRELAY_DOWNSTREAM_REST_ADDRESS=")),
		shellCommands(t, docBlock(t, "README.md", "sh", "curl "))...)
	if len(cmds) != 2 || cmds[1].words[0] != "curl" {
		t.Fatalf("the README's REST example: want the relay, then curl: %+v", cmds)
	}
	if got := relayArgs(t, cmds[0], ""); !slices.Equal(got, []string{"--config", "config.example.yaml"}) {
		t.Fatalf("the README's relay: %q, want the quick start's", got)
	}
	restAddr := cmds[0].env["XDSRELAY_DOWNSTREAM_REST_ADDRESS"]
	if restAddr == "" || len(cmds[0].env) != 1 {
		t.Fatalf("the README's relay sets %v, want XDSRELAY_DOWNSTREAM_REST_ADDRESS", cmds[0].env)
	}
	r := bootReadmeEnv(t, map[string]string{"XDSRELAY_DOWNSTREAM_REST_ADDRESS": "127.0.0.1:0"}, func(_, content string) string { return content })

	args := slices.Clone(cmds[1].words[1:])
	for i, a := range args {
		args[i] = strings.Replace(a, "http://"+restAddr+"/", "http://"+r.RESTAddr()+"/", 1)
	}
	body := runCurl(t, args)
	var resp discoverypb.DiscoveryResponse
	if err := protojson.Unmarshal(body, &resp); err != nil {
		t.Fatalf("the answer is not a DiscoveryResponse: %v\n%s", err, body)
	}
	shown := docBlock(t, "README.md", "text", `"versionInfo"`)
	for _, part := range []string{`"@type":"` + resp.GetTypeUrl() + `"`, `"name":"greeter-cluster"`} {
		if !strings.Contains(shown, part) || !strings.Contains(string(body), part) {
			t.Errorf("%s: in the README's answer %v, in the relay's %v", part, strings.Contains(shown, part), strings.Contains(string(body), part))
		}
	}
	if len(resp.GetResources()) != 1 {
		t.Errorf("%d resources, want the one named", len(resp.GetResources()))
	}
}

// runCurl runs a documented curl command with curl when there is one, else
// makes the same request (curlRequest), and returns the body of a 200
// answer.
func runCurl(t *testing.T, args []string) []byte {
	t.Helper()
	curl, err := exec.LookPath("curl")
	if err != nil {
		return curlRequest(t, args)
	}
	out, err := exec.Command(curl, append([]string{"-sS", "--fail", "--max-time", "10"}, args...)...).Output()
	if err != nil {
		t.Fatalf("curl %q: %v", args, err)
	}
	return out
}

// curlRequest makes the request curl would for -s, -H, -X, -d, --cacert,
// --cert, --key and a URL, and returns the body of a 200 answer.
func curlRequest(t *testing.T, args []string) []byte {
	t.Helper()
	var url, data, method, caFile, certFile, keyFile string
	header := http.Header{}
	for i := 0; i < len(args); i++ {
		flag := args[i]
		value := func() string {
			i++
			if i == len(args) {
				t.Fatalf("curl %s wants a value", flag)
			}
			return args[i]
		}
		switch flag {
		case "-s":
		case "-H":
			k, v, _ := strings.Cut(value(), ":")
			header.Add(k, strings.TrimSpace(v))
		case "-X":
			method = value()
		case "-d":
			data = value()
		case "--cacert":
			caFile = value()
		case "--cert":
			certFile = value()
		case "--key":
			keyFile = value()
		default:
			if strings.HasPrefix(flag, "-") {
				t.Fatalf("curl flag %s: not one this test makes", flag)
			}
			url = flag
		}
	}
	if !strings.Contains(url, "://") {
		url = "http://" + url // as curl takes a bare host:port/path
	}
	if method == "" {
		method = http.MethodGet
		if data != "" {
			method = http.MethodPost // as curl -d does
		}
	}
	req, err := http.NewRequest(method, url, strings.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	req.Header = header
	client := &http.Client{Timeout: 10 * time.Second}
	if caFile != "" || certFile != "" {
		client.Transport = &http.Transport{TLSClientConfig: curlTLS(t, caFile, certFile, keyFile)}
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("%s %s: %s %v\n%s", method, url, resp.Status, err, b)
	}
	return b
}

// curlTLS is what curl's --cacert, --cert and --key make of TLS.
func curlTLS(t *testing.T, caFile, certFile, keyFile string) *tls.Config {
	t.Helper()
	cfg := &tls.Config{}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			t.Fatal(err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			t.Fatalf("--cacert %s: no certificate", caFile)
		}
	}
	if certFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg
}

// Every command of the README and docs/ that runs the relay (`go run
// ./cmd/xdsrelay [serve] --config ...`, with the environment it sets) is a
// configuration `xdsrelay validate` accepts, from the repository root as
// the quick start runs it.
func TestDocumentedServeCommandsValidate(t *testing.T) {
	docs, err := filepath.Glob(filepath.Join(repo, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	t.Chdir(repo)
	ran := 0
	for _, doc := range append([]string{filepath.Join(repo, "README.md")}, docs...) {
		rel, _ := filepath.Rel(repo, doc)
		for _, block := range docBlocks(t, rel, "sh") {
			for _, c := range shellCommands(t, block) {
				if len(c.words) < 3 || strings.Join(c.words[:3], " ") != "go run ./cmd/xdsrelay" {
					continue
				}
				args := relayArgs(t, c, "")
				if len(args) > 0 && args[0] == "serve" {
					args = args[1:]
				} else if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
					continue // another command, run by the tests of its own
				}
				code, out, errOut := runCLIEnv(c.env, append([]string{"validate"}, args...)...)
				if code != 0 || !strings.HasPrefix(out, "configuration OK") {
					t.Errorf("%s: %q: xdsrelay validate exits %d, %q %q", rel, c.words, code, out, errOut)
				}
				ran++
			}
		}
	}
	if ran < 4 {
		t.Errorf("validated %d documented relay commands; the README and docs/control-planes.md show at least 4", ran)
	}
}

// The commands CONTRIBUTING.md and the README give for testing are what CI
// runs (.ci/run), and CONTRIBUTING.md's table of fuzz targets lists every
// target of the repository, in its package.
func TestContributingCommands(t *testing.T) {
	ci := map[string]bool{}
	b, err := os.ReadFile(filepath.Join(repo, ".ci", "run"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		ci[strings.TrimSpace(line)] = true
	}
	for _, doc := range []string{"README.md", "CONTRIBUTING.md"} {
		for _, cmd := range []string{"go vet ./... && go test -race ./...", "(cd deploy && go vet ./... && go test ./...)"} {
			shown := strings.Contains(docText(t, doc), "```sh\n"+cmd+"\n```")
			if shown && !ci[cmd] {
				t.Errorf("%s gives %q, which .ci/run does not run", doc, cmd)
			}
			if !shown && doc == "CONTRIBUTING.md" {
				t.Errorf("CONTRIBUTING.md does not give %q", cmd)
			}
		}
	}
	if !strings.Contains(docText(t, "README.md"), "```sh\ngo vet ./... && go test -race ./...\n```") {
		t.Error("the README does not give the test command")
	}

	have := map[string]string{} // fuzz target → ./package
	target := regexp.MustCompile(`(?m)^func (Fuzz\w+)\(f \*testing\.F\)`)
	walkRepo(t, func(path, rel string) {
		if !strings.HasSuffix(path, "_test.go") {
			return
		}
		src, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range target.FindAllStringSubmatch(string(src), -1) {
			have[m[1]] = "./" + filepath.ToSlash(filepath.Dir(rel))
		}
	})
	row := regexp.MustCompile("^\\| `(Fuzz\\w+)` \\| `(\\./[\\w/]+)` \\|")
	listed := map[string]string{}
	for _, line := range strings.Split(docText(t, "CONTRIBUTING.md"), "\n") {
		if m := row.FindStringSubmatch(line); m != nil {
			listed[m[1]] = m[2]
		}
	}
	if !maps.Equal(listed, have) {
		t.Errorf("CONTRIBUTING.md lists the fuzz targets %v; the repository has %v", listed, have)
	}
}

// docs/clients.md's fast failure, run as written (the relay's addresses
// moved, and its unreachable control plane a port known to be closed):
// the example client with -wait-for-ready=false fails with the relay's
// UNAVAILABLE, not DEADLINE_EXCEEDED after its -wait; and -xds-server
// reaches a relay on another port than the bootstrap's, or says the
// bootstrap names no server to replace.
func TestDocGreeterFailsFast(t *testing.T) {
	cmds := shellCommands(t, docBlock(t, "docs/clients.md", "sh", "-wait-for-ready=false"))
	if len(cmds) != 2 || !cmds[0].background || len(cmds[1].words) < 3 || cmds[1].words[2] != "./examples/greeter/client" {
		t.Fatalf("docs/clients.md's fast failure: %+v", cmds)
	}
	bin := buildExamples(t, "./examples/greeter/client", "./examples/greeter/server")
	env := maps.Clone(cmds[0].env)
	if env["XDSRELAY_UPSTREAM_ADDRESS"] != "localhost:1" {
		t.Fatalf("the doc's relay: %v", env)
	}
	env["XDSRELAY_UPSTREAM_ADDRESS"] = deadAddr(t)
	r := bootReadmeEnv(t, env, func(_, content string) string { return content })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	run := func(args ...string) (string, error) {
		c := exec.CommandContext(ctx, filepath.Join(bin, "client"), args...)
		c.Env = append(os.Environ(), "GRPC_XDS_BOOTSTRAP="+filepath.Join(repo, cmds[1].env["GRPC_XDS_BOOTSTRAP"]))
		out, err := c.CombinedOutput()
		return string(out), err
	}
	start := time.Now()
	out, err := run(append(slices.Clone(cmds[1].words[3:]), "-xds-server", r.Addr(), "-wait", "50s")...)
	t.Logf("the client failed after %s: %s", time.Since(start), out)
	want := strings.TrimSpace(docBlock(t, "docs/clients.md", "text", "xds:///greeter: "))
	if err == nil || !strings.Contains(out, want) {
		t.Fatalf("client: %v, %q; the doc shows %q", err, out, want)
	}

	port := freePort(t)
	good := bootReadme(t, moveGreeter(t, port))
	server := exec.CommandContext(ctx, filepath.Join(bin, "server"), "-addr", fmt.Sprintf("127.0.0.1:%d", port))
	if err := server.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		server.Process.Kill()
		server.Wait()
	}()
	if out, err := run("-xds-server", good.Addr()); err != nil || !strings.Contains(out, "xds:///greeter answered by greeter-1") {
		t.Fatalf("client -xds-server %s: %v, %q", good.Addr(), err, out)
	}

	// -xds-server with a bootstrap that names no server to replace fails
	// at once, saying so.
	empty := filepath.Join(t.TempDir(), "bootstrap.json")
	writeFile(t, empty, `{"node": {"id": "n"}}`)
	c := exec.CommandContext(ctx, filepath.Join(bin, "client"), "-xds-server", good.Addr())
	c.Env = append(os.Environ(), "GRPC_XDS_BOOTSTRAP="+empty)
	if out, err := c.CombinedOutput(); err == nil || !strings.Contains(string(out), "-xds-server: GRPC_XDS_BOOTSTRAP names no xds_servers") {
		t.Errorf("client -xds-server with no xds_servers: %v, %q", err, out)
	}
}
