package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/xdsrelay/xdsrelay/internal/authz"
)

// docs/protection.md's two examples of tenant isolation are configuration
// the relay takes (the Istio one with the first one's TLS, from the
// environment), and their rules decide as the text says: a client holding
// tenant-a's certificate may claim tenant-a's cluster but not tenant-b's,
// with the message the text quotes; an Istio workload may claim only its
// own namespace.
func TestDocTenantIsolationRules(t *testing.T) {
	doc := docText(t, "docs/protection.md")
	tenant := docRules(t, docBlock(t, "docs/protection.md", "yaml", "tenant/{tenant}"), nil)
	id := []string{"spiffe://example.org/tenant/tenant-a"}
	if err := tenant.Check(id, &corepb.Node{Cluster: "tenant-a"}); err != nil {
		t.Errorf("tenant-a claiming its own cluster: %v", err)
	}
	err := tenant.Check(id, &corepb.Node{Cluster: "tenant-b"})
	if err == nil || !strings.Contains(doc, "`xdsrelay: "+err.Error()+"`") {
		t.Errorf("tenant-a claiming tenant-b: %v; docs/protection.md quotes another message", err)
	}
	err = tenant.Check([]string{"spiffe://other.org/x"}, &corepb.Node{Cluster: "tenant-a"})
	if err == nil || !strings.Contains(doc, "`xdsrelay: "+err.Error()+"`") {
		t.Errorf("an identity no rule matches: %v; docs/protection.md quotes another message", err)
	}

	tls := map[string]string{
		"XDSRELAY_DOWNSTREAM_TLS_CERT_FILE":      "/etc/xdsrelay/tls.crt",
		"XDSRELAY_DOWNSTREAM_TLS_KEY_FILE":       "/etc/xdsrelay/tls.key",
		"XDSRELAY_DOWNSTREAM_TLS_CLIENT_CA_FILE": "/etc/xdsrelay/clients.pem",
	}
	istio := docRules(t, docBlock(t, "docs/protection.md", "yaml", "metadata.NAMESPACE"), tls)
	cart := []string{"spiffe://cluster.local/ns/shop/sa/cart"}
	sidecar := func(pod, ns string) *corepb.Node {
		meta, _ := structpb.NewStruct(map[string]any{"NAMESPACE": ns})
		return &corepb.Node{Id: "sidecar~10.1.2.3~" + pod + "." + ns + "~" + ns + ".svc.cluster.local", Metadata: meta}
	}
	if err := istio.Check(cart, sidecar("cart-7d9f", "shop")); err != nil {
		t.Errorf("a workload claiming its own namespace: %v", err)
	}
	bank := sidecar("cart-7d9f", "shop")
	bank.Metadata.Fields["NAMESPACE"] = structpb.NewStringValue("bank")
	for name, n := range map[string]*corepb.Node{"another namespace": sidecar("pay-1", "bank"), "another NAMESPACE in its metadata": bank} {
		if err := istio.Check(cart, n); err == nil {
			t.Errorf("a workload of shop claiming %s was admitted", name)
		}
	}
}

// docRules loads a configuration block, with env, as the relay does, and
// compiles its authorization rules as the relay does.
func docRules(t *testing.T, block string, env map[string]string) *authz.Authorizer {
	t.Helper()
	file := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(file, []byte(block), 0o600); err != nil {
		t.Fatal(err)
	}
	o, _, err := loadConfig(file, environ(env))
	if err != nil {
		t.Fatalf("%s\n%v", block, err)
	}
	rules := make([]authz.Rule, len(o.Relay.Downstream.Authorization.Rules))
	for i, r := range o.Relay.Downstream.Authorization.Rules {
		rules[i] = authz.Rule(r)
	}
	a, err := authz.New(rules)
	if err != nil {
		t.Fatal(err)
	}
	return a
}
