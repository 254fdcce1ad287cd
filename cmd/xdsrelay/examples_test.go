package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// buildExamples builds the example programs, as `go run` would, into a
// temporary directory and returns it.
func buildExamples(t *testing.T, pkgs ...string) string {
	t.Helper()
	bin := t.TempDir()
	args := append([]string{"build", "-o", bin + string(os.PathSeparator)}, pkgs...)
	cmd := exec.Command("go", args...)
	cmd.Dir = repo
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return bin
}

// The gRPC example works as written: the relay booted from
// config.example.yaml, examples/greeter/server listening where greeter.yaml
// says the endpoint is, and examples/greeter/client with
// examples/greeter/bootstrap.json (only server_uri moved to the relay's
// port) dials xds:///greeter through gRPC's own xDS resolver and prints the
// server's name.
func TestGreeterExample(t *testing.T) {
	bin := buildExamples(t, "./examples/greeter/server", "./examples/greeter/client")
	port := freePort(t)
	r := bootReadme(t, moveGreeter(t, port))

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var serverOut bytes.Buffer
	server := exec.CommandContext(ctx, filepath.Join(bin, "server"), "-addr", fmt.Sprintf("127.0.0.1:%d", port))
	server.Stdout, server.Stderr = &serverOut, &serverOut
	if err := server.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		server.Process.Kill()
		server.Wait()
	}()

	var bootstrap map[string]any
	b, err := os.ReadFile(filepath.Join(repo, "examples", "greeter", "bootstrap.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &bootstrap); err != nil {
		t.Fatalf("examples/greeter/bootstrap.json: %v", err)
	}
	servers := bootstrap["xds_servers"].([]any)
	if got := servers[0].(map[string]any)["server_uri"]; got != "localhost:18001" {
		t.Fatalf("bootstrap.json names %v, not the relay's downstream.address port (localhost:18001)", got)
	}
	servers[0].(map[string]any)["server_uri"] = r.Addr()
	if b, err = json.Marshal(bootstrap); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "bootstrap.json")
	if err := os.WriteFile(file, b, 0o600); err != nil {
		t.Fatal(err)
	}

	client := exec.CommandContext(ctx, filepath.Join(bin, "client"), "-wait", "30s")
	client.Env = append(os.Environ(), "GRPC_XDS_BOOTSTRAP="+file)
	out, err := client.CombinedOutput()
	if err != nil {
		t.Fatalf("client: %v\n%s\nserver:\n%s", err, out, serverOut.String())
	}
	if want := "xds:///greeter answered by greeter-1"; !strings.Contains(string(out), want) {
		t.Fatalf("client printed %q, want %q", out, want)
	}
}
