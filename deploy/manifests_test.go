package deploy

import (
	"fmt"
	"math"
	"net"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"
)

// upstreamEnv is where the kustomize Deployment names the control plane.
const upstreamEnv = "XDSRELAY_UPSTREAM_ADDRESS"

// adminCertEnv is set when the admin endpoint is served over admin.tls.
const adminCertEnv = "XDSRELAY_ADMIN_TLS_CERT_FILE"

// nonDefaultValues are chart values that change what can change.
const nonDefaultValues = `
replicaCount: 3
image:
  repository: registry.example/xdsrelay
  tag: v1.2.3
ports:
  xds: 15010
  admin: 15014
resources:
  requests: {cpu: 500m, memory: 512Mi}
  limits: {cpu: "4", memory: 2Gi}
autoscaling:
  enabled: true
  minReplicas: 3
  maxReplicas: 12
  targetCPUUtilizationPercentage: 70
serviceMonitor:
  enabled: true
  labels: {release: prometheus}
adminTLS:
  enabled: true
  secretName: relay-admin
podDisruptionBudget:
  minAvailable: 2
networkPolicy:
  adminFrom:
    - namespaceSelector:
        matchLabels:
          kubernetes.io/metadata.name: observability
extraEnv:
  - name: XDSRELAY_CACHE_RETENTION
    value: 10m
config:
  upstream:
    address: istiod.istio-system.svc:15010
    group_by: [cluster, metadata.NAMESPACE]
  rollout:
    canary: 0.05
  log:
    format: json
`

// installs are the relay's installs as docs/kubernetes.md gives them, rendered:
// kustomize's deploy/ and its admin mTLS overlay, and the chart with its
// defaults and with other values.
func installs(t *testing.T) []manifests {
	t.Helper()
	return []manifests{
		renderKustomize(t, "."),
		renderKustomize(t, "overlays/admin-mtls"),
		renderChart(t, chartRelease, chartNamespace, nil),
		renderChart(t, "edge", "mesh-edge", chartValues(t, nonDefaultValues)),
	}
}

// TestInstalls holds every install to the same rules: the checks deploy/'s
// manifests have always had, the configuration `xdsrelay validate` accepts,
// and what a cluster expects of them.
func TestInstalls(t *testing.T) {
	bin := relayBinary(t)
	for _, m := range installs(t) {
		t.Run(m.source, func(t *testing.T) { checkInstall(t, bin, m) })
	}
}

// checkInstall holds one rendered install to the rules; bin is the relay
// binary that validates its configuration.
func checkInstall(t *testing.T, bin string, m manifests) {
	t.Helper()
	checkSelectors(t, m)
	checkDeployment(t, m)
	checkSecurity(t, m)
	checkGoMemLimit(t, m)
	checkProbesAndPorts(t, m)
	checkHeadlessAdmin(t, m)
	checkFleet(t, m)
	checkConfigMatchesContainer(t, m)
	checkNetworkPolicy(t, m)
	validateConfig(t, bin, m)
}

func TestManifestFilesDecode(t *testing.T) {
	for _, f := range manifestFiles(t) {
		decodeFile(t, f)
	}
}

func TestKustomizationListsEveryManifest(t *testing.T) {
	var k struct {
		APIVersion string   `json:"apiVersion"`
		Kind       string   `json:"kind"`
		Resources  []string `json:"resources"`
		Images     []struct {
			Name    string `json:"name"`
			NewName string `json:"newName"`
			NewTag  string `json:"newTag"`
		} `json:"images"`
	}
	data, err := os.ReadFile(filepath.Join(baseDir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(data, &k); err != nil {
		t.Fatalf("base/kustomization.yaml: %v", err)
	}
	if k.APIVersion != "kustomize.config.k8s.io/v1beta1" || k.Kind != "Kustomization" {
		t.Errorf("base/kustomization.yaml: apiVersion/kind %s %s", k.APIVersion, k.Kind)
	}
	if got, want := slices.Sorted(slices.Values(k.Resources)), manifestFiles(t); !slices.Equal(got, want) {
		t.Errorf("base/kustomization.yaml resources %v, want the manifests %v", got, want)
	}
	m := renderKustomize(t, ".")
	if len(k.Images) != 1 || k.Images[0].Name != imageName(relayContainer(t, m.deployment).Image) {
		t.Errorf("base/kustomization.yaml images %+v: want one entry for the Deployment's image", k.Images)
	}
}

// kustomize edit set image xdsrelay=REGISTRY/xdsrelay:TAG sets the
// Deployment's image through the images: entry.
func TestKustomizeSetImage(t *testing.T) {
	dir := t.TempDir()
	for _, f := range append(manifestFiles(t), "kustomization.yaml") {
		b, err := os.ReadFile(filepath.Join(baseDir, f))
		if err != nil {
			t.Fatal(err)
		}
		if f == "kustomization.yaml" {
			b = regexp.MustCompile(`newName: xdsrelay\n    newTag: \S+`).ReplaceAll(b, []byte("newName: registry.example/xdsrelay\n    newTag: v1.2.3"))
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	m := renderKustomize(t, dir)
	if got := relayContainer(t, m.deployment).Image; got != "registry.example/xdsrelay:v1.2.3" {
		t.Errorf("image %q after setting it in images:", got)
	}
}

// The chart's default install is deploy/'s: the same objects, pods, ports,
// probes, security, spread and configuration (its control plane in the
// configuration rather than the environment), and the same GOMEMLIMIT.
func TestChartMatchesKustomize(t *testing.T) {
	k := renderKustomize(t, ".")
	h := renderChart(t, chartRelease, chartNamespace, nil)
	if h.hpa != nil || h.monitor != nil {
		t.Error("the chart's defaults add an HPA or a ServiceMonitor")
	}
	for kind, present := range map[string][2]bool{
		"PodDisruptionBudget": {k.pdb != nil, h.pdb != nil},
		"NetworkPolicy":       {k.netpol != nil, h.netpol != nil},
		"ServiceAccount":      {k.account != nil, h.account != nil},
	} {
		if present[0] != present[1] {
			t.Errorf("%s: kustomize %v, chart %v", kind, present[0], present[1])
		}
	}
	if k.deployment.Name != h.deployment.Name || k.service.Name != h.service.Name || k.config.Name != h.config.Name {
		t.Errorf("names differ: kustomize %s, chart %s", k.deployment.Name, h.deployment.Name)
	}
	kp, hp := podShape(t, k.deployment), podShape(t, h.deployment)
	if !reflect.DeepEqual(kp, hp) {
		kb, _ := yaml.Marshal(kp)
		hb, _ := yaml.Marshal(hp)
		t.Errorf("the pods differ:\nkustomize:\n%s\nchart:\n%s", kb, hb)
	}
	if !reflect.DeepEqual(k.deployment.Spec.Strategy, h.deployment.Spec.Strategy) || *k.deployment.Spec.Replicas != *h.deployment.Spec.Replicas {
		t.Error("the Deployments' replicas or strategy differ")
	}
	if !reflect.DeepEqual(k.service.Spec.Ports, h.service.Spec.Ports) || k.service.Spec.Type != h.service.Spec.Type {
		t.Errorf("the Services' ports differ: %v, %v", k.service.Spec.Ports, h.service.Spec.Ports)
	}
	if k.peers.Name != h.peers.Name || !reflect.DeepEqual(k.peers.Spec.Ports, h.peers.Spec.Ports) || k.peers.Spec.PublishNotReadyAddresses != h.peers.Spec.PublishNotReadyAddresses {
		t.Errorf("the peers Services differ: %s %v, %s %v", k.peers.Name, k.peers.Spec, h.peers.Name, h.peers.Spec)
	}
	if k.headless.Name != h.headless.Name || !reflect.DeepEqual(k.headless.Spec.Ports, h.headless.Spec.Ports) {
		t.Errorf("the headless Services differ: %s %v, %s %v", k.headless.Name, k.headless.Spec.Ports, h.headless.Name, h.headless.Spec.Ports)
	}
	if !reflect.DeepEqual(k.pdb.Spec.MinAvailable, h.pdb.Spec.MinAvailable) {
		t.Error("the PodDisruptionBudgets differ")
	}
	if !reflect.DeepEqual(k.netpol.Spec.Ingress, h.netpol.Spec.Ingress) || !reflect.DeepEqual(k.netpol.Spec.PolicyTypes, h.netpol.Spec.PolicyTypes) {
		t.Errorf("the NetworkPolicies differ: %v, %v", k.netpol.Spec.Ingress, h.netpol.Spec.Ingress)
	}
	if !reflect.DeepEqual(k.account.AutomountServiceAccountToken, h.account.AutomountServiceAccountToken) {
		t.Error("the ServiceAccounts differ")
	}
	kc, hc := flatten("", relayConfig(t, k.config)), flatten("", relayConfig(t, h.config))
	for key, v := range kc {
		if key == "upstream.address" {
			continue
		}
		if !reflect.DeepEqual(hc[key], v) {
			t.Errorf("config %s: kustomize %v, chart %v", key, v, hc[key])
		}
	}
	for key := range hc {
		if _, ok := kc[key]; !ok {
			t.Errorf("config %s: only in the chart", key)
		}
	}
	if want := envValue(relayContainer(t, k.deployment), upstreamEnv); hc["upstream.address"] != want {
		t.Errorf("the chart's upstream.address %v, the kustomize Deployment's %s %q", hc["upstream.address"], upstreamEnv, want)
	}
	if kg, hg := goMemLimit(t, relayContainer(t, k.deployment)), goMemLimit(t, relayContainer(t, h.deployment)); kg/hg < 0.99 || kg/hg > 1.01 {
		t.Errorf("GOMEMLIMIT: kustomize %.0f, chart %.0f", kg, hg)
	}
}

// podShape is a pod template as both installs write it, less what differs
// by design: labels and annotations (the chart's name its release), the
// spread's selector (which the chart's labels change), and GOMEMLIMIT's and
// the control plane's variables (the chart computes the one, and puts the
// other in the configuration).
func podShape(t *testing.T, d *appsv1.Deployment) corev1.PodSpec {
	t.Helper()
	spec := *d.Spec.Template.Spec.DeepCopy()
	for i := range spec.TopologySpreadConstraints {
		spec.TopologySpreadConstraints[i].LabelSelector = nil
	}
	for i := range spec.Containers {
		spec.Containers[i].Env = slices.DeleteFunc(spec.Containers[i].Env, func(e corev1.EnvVar) bool {
			return e.Name == "GOMEMLIMIT" || e.Name == upstreamEnv
		})
		if len(spec.Containers[i].Env) == 0 {
			spec.Containers[i].Env = nil
		}
	}
	return spec
}

// Values other than the defaults change what they say, and the install
// still follows the rules (TestInstalls).
func TestChartNonDefaultValues(t *testing.T) {
	m := renderChart(t, "edge", "mesh-edge", chartValues(t, nonDefaultValues))
	c := relayContainer(t, m.deployment)
	if c.Image != "registry.example/xdsrelay:v1.2.3" {
		t.Errorf("image %q", c.Image)
	}
	if m.deployment.Name != "edge-xdsrelay" || m.deployment.Namespace != "mesh-edge" {
		t.Errorf("deployment %s/%s, want mesh-edge/edge-xdsrelay", m.deployment.Namespace, m.deployment.Name)
	}
	if m.deployment.Spec.Replicas != nil {
		t.Errorf("replicas %d with autoscaling: leave them to the HPA", *m.deployment.Spec.Replicas)
	}
	if h := m.hpa; h == nil || *h.Spec.MinReplicas != 3 || h.Spec.MaxReplicas != 12 || h.Spec.ScaleTargetRef.Name != m.deployment.Name ||
		len(h.Spec.Metrics) != 1 || h.Spec.Metrics[0].Resource.Name != corev1.ResourceCPU || *h.Spec.Metrics[0].Resource.Target.AverageUtilization != 70 {
		t.Errorf("HPA %+v", m.hpa)
	}
	if m.pdb.Spec.MinAvailable.IntValue() != 2 {
		t.Errorf("PDB minAvailable %v", m.pdb.Spec.MinAvailable)
	}
	if got := envValue(c, "XDSRELAY_CACHE_RETENTION"); got != "10m" {
		t.Errorf("extraEnv: XDSRELAY_CACHE_RETENTION %q", got)
	}
	cfg := flatten("", relayConfig(t, m.config))
	for key, want := range map[string]any{
		"upstream.address": "istiod.istio-system.svc:15010", "rollout.canary": 0.05, "log.format": "json",
		"downstream.address": "0.0.0.0:15010", "admin.address": "0.0.0.0:15014", "admin.ready_after_sync": true,
		"upstream.group_by": []any{"cluster", "metadata.NAMESPACE"},
	} {
		if !reflect.DeepEqual(cfg[key], want) {
			t.Errorf("config %s: %v, want %v", key, cfg[key], want)
		}
	}
	if secret := secretVolume(m.deployment, "relay-admin"); secret == nil {
		t.Error("adminTLS: no volume of the Secret relay-admin")
	}
	mon := m.monitor
	if mon == nil || mon.Metadata.Labels["release"] != "prometheus" || len(mon.Spec.Endpoints) != 1 {
		t.Fatalf("ServiceMonitor %+v", mon)
	}
	ep := mon.Spec.Endpoints[0]
	if ep.Port != "admin" || ep.Path != "/metrics" || ep.Scheme != "https" || ep.TLSConfig == nil || ep.TLSConfig.CA == nil ||
		ep.TLSConfig.CA.Secret.Name != "relay-admin" || ep.TLSConfig.CA.Secret.Key != "ca.crt" || ep.TLSConfig.ServerName != "edge-xdsrelay.mesh-edge.svc" {
		t.Errorf("ServiceMonitor endpoint %+v", ep)
	}
	if !slices.Equal(mon.Spec.NamespaceSelector.MatchNames, []string{"mesh-edge"}) || !selects(t, &mon.Spec.Selector, m.service.Labels) {
		t.Errorf("the ServiceMonitor does not select the Service: %+v", mon.Spec)
	}
	if got, want := goMemLimit(t, c), math.Floor(0.9*float64(2<<30)); got != want {
		t.Errorf("GOMEMLIMIT %.0f, want 90%% of 2Gi", got)
	}
	admin := m.netpol.Spec.Ingress[1]
	if len(admin.From) != 1 || admin.From[0].NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"] != "observability" {
		t.Errorf("networkPolicy.adminFrom: %+v", admin.From)
	}
}

// TestConfigInSyncWithExample keeps the ConfigMap's config.yaml the
// example's: the same keys, the same values but for the two it must change.
func TestConfigInSyncWithExample(t *testing.T) {
	m := renderKustomize(t, ".")
	data, err := os.ReadFile("../config.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var example map[string]any
	if err := yaml.UnmarshalStrict(data, &example); err != nil {
		t.Fatalf("config.example.yaml: %v", err)
	}
	want, got := flatten("", example), flatten("", relayConfig(t, m.config))
	differs := map[string]bool{"admin.address": true, "upstream.address": true}
	for key, v := range want {
		g, ok := got[key]
		switch {
		case !ok:
			t.Errorf("configmap: %s missing (config.example.yaml has it)", key)
		case !differs[key] && !reflect.DeepEqual(g, v):
			t.Errorf("configmap: %s is %v, config.example.yaml has %v", key, g, v)
		}
	}
	for key := range got {
		if _, ok := want[key]; !ok {
			t.Errorf("configmap: %s is not in config.example.yaml", key)
		}
	}
	if got["upstream.address"] != "" {
		t.Errorf("configmap: upstream.address %v, want it empty (left to %s)", got["upstream.address"], upstreamEnv)
	}
	if got["admin.ready_after_sync"] != true {
		t.Error("configmap: admin.ready_after_sync is not true: a pod with a wrong upstream would be ready")
	}
}

func checkSelectors(t *testing.T, m manifests) {
	t.Helper()
	pod := m.deployment.Spec.Template.Labels
	selectors := map[string]*metav1.LabelSelector{
		"deployment": m.deployment.Spec.Selector,
		"service":    {MatchLabels: m.service.Spec.Selector},
	}
	if m.pdb != nil {
		selectors["pdb"] = m.pdb.Spec.Selector
	}
	if m.netpol != nil {
		selectors["networkpolicy"] = &m.netpol.Spec.PodSelector
	}
	for i, c := range m.deployment.Spec.Template.Spec.TopologySpreadConstraints {
		selectors[fmt.Sprintf("topologySpreadConstraints[%d]", i)] = c.LabelSelector
	}
	for name, ls := range selectors {
		if !selects(t, ls, pod) {
			t.Errorf("%s: selector %v does not select the pod labels %v", name, ls, pod)
		}
	}
	if len(m.deployment.Spec.Template.Spec.TopologySpreadConstraints) == 0 {
		t.Error("no topologySpreadConstraints: replicas may share a node")
	}
}

func selects(t *testing.T, ls *metav1.LabelSelector, set map[string]string) bool {
	t.Helper()
	if ls == nil {
		return false
	}
	sel, err := metav1.LabelSelectorAsSelector(ls)
	if err != nil {
		t.Fatalf("selector %v: %v", ls, err)
	}
	return !sel.Empty() && sel.Matches(labels.Set(set))
}

func checkDeployment(t *testing.T, m manifests) {
	t.Helper()
	d := m.deployment
	switch {
	case m.hpa == nil && (d.Spec.Replicas == nil || *d.Spec.Replicas < 2):
		t.Errorf("replicas %v, want 2 or more", d.Spec.Replicas)
	case m.hpa != nil && (*m.hpa.Spec.MinReplicas < 2 || m.hpa.Spec.ScaleTargetRef.Name != d.Name):
		t.Errorf("HPA %+v: want 2 replicas or more of the Deployment", m.hpa.Spec)
	}
	ru := d.Spec.Strategy.RollingUpdate
	if d.Spec.Strategy.Type != appsv1.RollingUpdateDeploymentStrategyType || ru == nil || ru.MaxUnavailable.IntValue() != 0 || ru.MaxSurge.IntValue() != 1 {
		t.Errorf("strategy %+v: want a RollingUpdate that starts a pod before stopping one", d.Spec.Strategy)
	}
	c := relayContainer(t, d)
	if want := []string{"--config", "/etc/xdsrelay/config.yaml"}; !slices.Equal(c.Args, want) {
		t.Errorf("args %q, want %q", c.Args, want)
	}
	for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		if _, ok := c.Resources.Requests[r]; !ok {
			t.Errorf("no %s request", r)
		}
		if _, ok := c.Resources.Limits[r]; !ok {
			t.Errorf("no %s limit", r)
		}
	}
	spec := d.Spec.Template.Spec
	if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
		t.Error("automountServiceAccountToken is not false: the relay calls no Kubernetes API")
	}
	if m.account == nil || spec.ServiceAccountName != m.account.Name || m.account.AutomountServiceAccountToken == nil || *m.account.AutomountServiceAccountToken {
		t.Errorf("serviceAccountName %q: want the install's ServiceAccount, which mounts no token", spec.ServiceAccountName)
	}
}

func checkSecurity(t *testing.T, m manifests) {
	t.Helper()
	pod := m.deployment.Spec.Template.Spec.SecurityContext
	if pod == nil || pod.RunAsNonRoot == nil || !*pod.RunAsNonRoot || pod.SeccompProfile == nil || pod.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Error("pod securityContext: want runAsNonRoot and the RuntimeDefault seccomp profile")
	}
	sc := relayContainer(t, m.deployment).SecurityContext
	if sc == nil {
		t.Fatal("container: no securityContext")
	}
	for name, v := range map[string]*bool{"runAsNonRoot": sc.RunAsNonRoot, "readOnlyRootFilesystem": sc.ReadOnlyRootFilesystem} {
		if v == nil || !*v {
			t.Errorf("securityContext.%s not true", name)
		}
	}
	if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Error("securityContext.allowPrivilegeEscalation not false")
	}
	if sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0 {
		t.Error("securityContext.capabilities: want all dropped")
	}
}

// goMemLimit is the container's GOMEMLIMIT in bytes, in the syntax the Go
// runtime reads (a number, or one with B, KiB, MiB, GiB or TiB).
func goMemLimit(t *testing.T, c corev1.Container) float64 {
	t.Helper()
	v := envValue(c, "GOMEMLIMIT")
	units := []struct {
		suffix string
		mult   float64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"B", 1}}
	mult := 1.0
	for _, u := range units {
		if n, ok := strings.CutSuffix(v, u.suffix); ok {
			v, mult = n, u.mult
			break
		}
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		t.Fatalf("GOMEMLIMIT %q is not a size the Go runtime reads", envValue(c, "GOMEMLIMIT"))
	}
	return float64(n) * mult
}

// checkGoMemLimit holds GOMEMLIMIT to about 90% of the memory limit: below
// it, so that the garbage collector works before the kernel kills.
func checkGoMemLimit(t *testing.T, m manifests) {
	t.Helper()
	c := relayContainer(t, m.deployment)
	limit := c.Resources.Limits[corev1.ResourceMemory]
	ratio := goMemLimit(t, c) / float64(limit.Value())
	if ratio < 0.85 || ratio > 0.95 {
		t.Errorf("GOMEMLIMIT %s is %.0f%% of limits.memory %s, want about 90%%", envValue(c, "GOMEMLIMIT"), 100*ratio, limit.String())
	}
}

func checkProbesAndPorts(t *testing.T, m manifests) {
	t.Helper()
	c := relayContainer(t, m.deployment)
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	if ports["xds"] == 0 || ports["admin"] == 0 {
		t.Errorf("container ports %v, want xds and admin", ports)
	}
	tls := envValue(c, adminCertEnv) != ""
	wantScheme := corev1.URISchemeHTTP
	if tls {
		wantScheme = corev1.URISchemeHTTPS
	}
	for name, p := range map[string]struct {
		probe *corev1.Probe
		path  string
	}{"readinessProbe": {c.ReadinessProbe, "/readyz"}, "livenessProbe": {c.LivenessProbe, "/healthz"}} {
		if p.probe == nil || p.probe.HTTPGet == nil {
			t.Errorf("%s: no httpGet", name)
			continue
		}
		get := p.probe.HTTPGet
		scheme := get.Scheme
		if scheme == "" {
			scheme = corev1.URISchemeHTTP
		}
		if get.Path != p.path || get.Port != intstr.FromString("admin") || scheme != wantScheme {
			t.Errorf("%s: %s %s on port %v, want %s %s on port admin", name, scheme, get.Path, get.Port.String(), wantScheme, p.path)
		}
	}
	for _, sp := range m.service.Spec.Ports {
		if sp.TargetPort.Type != intstr.String || ports[sp.TargetPort.StrVal] != sp.Port {
			t.Errorf("service port %s: targetPort %v names no container port %d", sp.Name, sp.TargetPort.String(), sp.Port)
		}
	}
	if got := servicePort(m.service, "xds"); got == nil || got.AppProtocol == nil || *got.AppProtocol != "grpc" {
		t.Error("service: no xds port with appProtocol grpc")
	}
	wantAdmin := map[bool]string{false: "http", true: "https"}[tls]
	if got := servicePort(m.service, "admin"); got == nil || got.AppProtocol == nil || *got.AppProtocol != wantAdmin {
		t.Errorf("service: no admin port with appProtocol %s", wantAdmin)
	}
	if tls {
		checkAdminTLSMount(t, m.deployment)
	}
}

// checkHeadlessAdmin holds the headless Service that xdsrelay wait
// --admin and status --summary resolve to every replica (docs/cli.md,
// wait): no cluster IP, the relay's pods (ready or not: a replica still
// syncing has clients to count), only the admin port, as the Service has it.
func checkHeadlessAdmin(t *testing.T, m manifests) {
	t.Helper()
	h := m.headless
	if h.Spec.ClusterIP != corev1.ClusterIPNone || !h.Spec.PublishNotReadyAddresses {
		t.Errorf("headless Service %s: clusterIP %q, publishNotReadyAddresses %v; want None and true", h.Name, h.Spec.ClusterIP, h.Spec.PublishNotReadyAddresses)
	}
	if h.Name != m.service.Name+"-admin" || h.Namespace != m.service.Namespace {
		t.Errorf("headless Service %s/%s, want %s/%s-admin", h.Namespace, h.Name, m.service.Namespace, m.service.Name)
	}
	if !reflect.DeepEqual(h.Spec.Selector, m.service.Spec.Selector) || !selects(t, &metav1.LabelSelector{MatchLabels: h.Spec.Selector}, m.deployment.Spec.Template.Labels) {
		t.Errorf("headless Service selector %v does not select the relay's pods as the Service does (%v)", h.Spec.Selector, m.service.Spec.Selector)
	}
	if admin := servicePort(m.service, "admin"); len(h.Spec.Ports) != 1 || admin == nil || !reflect.DeepEqual(h.Spec.Ports[0], *admin) {
		t.Errorf("headless Service ports %v, want only the Service's admin port %v", h.Spec.Ports, admin)
	}
}

// checkAdminTLSMount holds admin.tls's files to a Secret's volume, mounted
// where the variables say, with the Secret's keys.
func checkAdminTLSMount(t *testing.T, d *appsv1.Deployment) {
	t.Helper()
	c := relayContainer(t, d)
	dir := path.Dir(envValue(c, adminCertEnv))
	want := map[string]string{adminCertEnv: "tls.crt", "XDSRELAY_ADMIN_TLS_KEY_FILE": "tls.key", "XDSRELAY_ADMIN_TLS_CLIENT_CA_FILE": "ca.crt"}
	for env, key := range want {
		if got := envValue(c, env); got != path.Join(dir, key) {
			t.Errorf("%s %q, want %s", env, got, path.Join(dir, key))
		}
	}
	for _, vm := range c.VolumeMounts {
		if vm.MountPath != dir {
			continue
		}
		for _, v := range d.Spec.Template.Spec.Volumes {
			if v.Name == vm.Name && v.Secret != nil {
				if strings.HasPrefix(dir, "/etc/xdsrelay/") {
					t.Errorf("the Secret is mounted in the ConfigMap's volume (%s)", dir)
				}
				if d.Spec.Template.Spec.SecurityContext.FSGroup == nil && (v.Secret.DefaultMode == nil || *v.Secret.DefaultMode&0o004 == 0) {
					t.Error("the Secret's files are not readable by the relay's user: set fsGroup")
				}
				return
			}
		}
	}
	t.Errorf("no Secret volume mounted at %s", dir)
}

func secretVolume(d *appsv1.Deployment, name string) *corev1.SecretVolumeSource {
	for _, v := range d.Spec.Template.Spec.Volumes {
		if v.Secret != nil && v.Secret.SecretName == name {
			return v.Secret
		}
	}
	return nil
}

func checkConfigMatchesContainer(t *testing.T, m manifests) {
	t.Helper()
	c := relayContainer(t, m.deployment)
	cfg := relayConfig(t, m.config)
	checkListenPort(t, cfg, "admin.address", containerPort(c, "admin"))
	checkListenPort(t, cfg, "downstream.address", containerPort(c, "xds"))
	if host, _, _ := net.SplitHostPort(str(cfg, "admin.address")); host != "0.0.0.0" {
		t.Errorf("admin.address %q: the kubelet's probes need all interfaces", str(cfg, "admin.address"))
	}
	checkLocalAdmin(t, m, cfg)
	if got := mountedConfig(t, m); got != c.Args[len(c.Args)-1] {
		t.Errorf("the ConfigMap's config.yaml is mounted at %q, the relay reads %q", got, c.Args[len(c.Args)-1])
	}
	// docs/operations.md, Shutdown: shutdown_timeout for streams, then as long again.
	shutdown, err := time.ParseDuration(str(cfg, "shutdown_timeout"))
	if err != nil {
		t.Fatalf("shutdown_timeout: %v", err)
	}
	grace := m.deployment.Spec.Template.Spec.TerminationGracePeriodSeconds
	if grace == nil || time.Duration(*grace)*time.Second <= 2*shutdown {
		t.Errorf("terminationGracePeriodSeconds %v, want more than twice shutdown_timeout (%v)", grace, shutdown)
	}
	if m.pdb == nil || m.pdb.Spec.MinAvailable == nil || m.pdb.Spec.MinAvailable.IntValue() < 1 {
		t.Error("pdb: want minAvailable 1 or more")
	}
	if up := upstreamOf(t, m); up == "" || strings.HasPrefix(up, "file://") {
		t.Errorf("upstream %q: want a control plane (the configuration or %s)", up, upstreamEnv)
	}
	if flatten("", cfg)["admin.ready_after_sync"] != true {
		t.Error("admin.ready_after_sync is not true")
	}
}

// checkLocalAdmin holds admin.local_address, the read-only views for
// kubectl port-forward and exec, to what keeps it from other pods: bound
// to 127.0.0.1, on a port no container port, Service or NetworkPolicy
// names, which a sidecar does not intercept.
func checkLocalAdmin(t *testing.T, m manifests, cfg map[string]any) {
	t.Helper()
	host, port, err := net.SplitHostPort(str(cfg, "admin.local_address"))
	if err != nil || host != "127.0.0.1" {
		t.Fatalf("admin.local_address %q: want 127.0.0.1:PORT, which kubectl port-forward dials", str(cfg, "admin.local_address"))
	}
	for _, p := range relayContainer(t, m.deployment).Ports {
		if fmt.Sprint(p.ContainerPort) == port {
			t.Errorf("container port %s (%s) is admin.local_address's: it must stay undeclared", p.Name, port)
		}
	}
	for _, svc := range []*corev1.Service{m.service, m.headless} {
		if svc == nil {
			continue
		}
		for _, p := range svc.Spec.Ports {
			if p.TargetPort.String() == port || fmt.Sprint(p.Port) == port {
				t.Errorf("Service %s exposes admin.local_address's port %s", svc.Name, port)
			}
		}
	}
	if m.netpol != nil {
		for _, rule := range m.netpol.Spec.Ingress {
			for _, p := range rule.Ports {
				if p.Port != nil && p.Port.String() == port {
					t.Errorf("the NetworkPolicy opens admin.local_address's port %s", port)
				}
			}
		}
	}
	annotations := m.deployment.Spec.Template.Annotations
	for _, key := range []string{"traffic.sidecar.istio.io/excludeInboundPorts", "config.linkerd.io/skip-inbound-ports"} {
		if annotations[key] != port {
			t.Errorf("pod annotation %s %q, want %s: a sidecar must not forward other pods' connections to admin.local_address", key, annotations[key], port)
		}
	}
}

// upstreamOf is the control plane the relay is given: the Deployment's
// variable, else the configuration's.
func upstreamOf(t *testing.T, m manifests) string {
	t.Helper()
	if v := envValue(relayContainer(t, m.deployment), upstreamEnv); v != "" {
		return v
	}
	return str(relayConfig(t, m.config), "upstream.address")
}

// checkNetworkPolicy holds the NetworkPolicy to: ingress only, the xDS
// port from anywhere in the cluster, the admin port from some namespaces
// only, nothing else open.
func checkNetworkPolicy(t *testing.T, m manifests) {
	t.Helper()
	np := m.netpol
	if np == nil {
		t.Fatal("no NetworkPolicy")
	}
	if !slices.Equal(np.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}) {
		t.Errorf("policyTypes %v, want [Ingress]", np.Spec.PolicyTypes)
	}
	open := map[string]bool{}
	for _, rule := range np.Spec.Ingress {
		if len(rule.Ports) != 1 || rule.Ports[0].Port == nil || len(rule.From) == 0 {
			t.Errorf("ingress rule %+v: want one port and its peers", rule)
			continue
		}
		port := rule.Ports[0].Port.String()
		open[port] = true
		everyone := slices.ContainsFunc(rule.From, func(p networkingv1.NetworkPolicyPeer) bool {
			return p.NamespaceSelector != nil && len(p.NamespaceSelector.MatchLabels) == 0 && len(p.NamespaceSelector.MatchExpressions) == 0 && p.PodSelector == nil
		})
		switch port {
		case "xds":
			if !everyone {
				t.Errorf("the xds port is open to %+v, want every namespace", rule.From)
			}
		case "admin":
			if everyone || slices.ContainsFunc(rule.From, func(p networkingv1.NetworkPolicyPeer) bool { return p.IPBlock != nil }) {
				t.Errorf("the admin port is open to %+v, want some namespaces only", rule.From)
			}
		default:
			t.Errorf("port %s open", port)
		}
	}
	if !open["xds"] || !open["admin"] {
		t.Errorf("open ports %v, want xds and admin", open)
	}
}

// validateConfig runs `xdsrelay validate --keys-only` on the ConfigMap's
// config.yaml with the Deployment's environment: the certificates it names
// are mounted in the pod, not here.
func validateConfig(t *testing.T, bin string, m manifests) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(file, []byte(m.config.Data["config.yaml"]), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "validate", "--keys-only", "--config", file)
	cmd.Env = containerEnv(relayContainer(t, m.deployment))
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "configuration OK") {
		t.Errorf("xdsrelay validate: %v\n%s", err, out)
	}
}

// podIP is the pod's IP in a test that runs a pod's container: the value of
// a variable from the downward API's status.podIP.
const podIP = "10.0.0.5"

// containerEnv is the container's variables that have a value, as
// KEY=value entries, and PATH: status.podIP's is podIP, and $(NAME) of a
// variable defined before is expanded, as the kubelet does.
func containerEnv(c corev1.Container) []string {
	env := []string{"PATH=" + os.Getenv("PATH")}
	defined := map[string]string{}
	for _, e := range c.Env {
		v := e.Value
		switch {
		case e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "status.podIP":
			v = podIP
		case e.ValueFrom != nil:
			continue
		}
		for name, value := range defined {
			v = strings.ReplaceAll(v, "$("+name+")", value)
		}
		defined[e.Name] = v
		env = append(env, e.Name+"="+v)
	}
	return env
}

// checkFleet holds an install to docs/kubernetes.md's fleet: a headless
// Service on the xDS port listing every pod, not-ready ones too, that
// fleet.peers names; fleet.self the pod's IP on the xDS port, from the
// downward API; the admin address advertised; three replicas, or an HPA of
// three at least, and a PodDisruptionBudget that keeps two.
func checkFleet(t *testing.T, m manifests) {
	t.Helper()
	p, c := m.peers, relayContainer(t, m.deployment)
	if p == nil {
		t.Fatal("no headless peers Service")
	}
	if p.Spec.ClusterIP != corev1.ClusterIPNone || !p.Spec.PublishNotReadyAddresses || p.Namespace != m.service.Namespace ||
		!reflect.DeepEqual(p.Spec.Selector, m.service.Spec.Selector) {
		t.Errorf("peers Service %s: clusterIP %q, publishNotReadyAddresses %v, selector %v", p.Name, p.Spec.ClusterIP, p.Spec.PublishNotReadyAddresses, p.Spec.Selector)
	}
	xds := servicePort(m.service, "xds")
	if len(p.Spec.Ports) != 1 || xds == nil || p.Spec.Ports[0].Port != xds.Port || p.Spec.Ports[0].TargetPort != xds.TargetPort {
		t.Errorf("peers Service ports %v, want only the xDS port %v", p.Spec.Ports, xds)
	}
	port := containerPort(c, "xds")
	if got, want := envValue(c, "XDSRELAY_FLEET_PEERS"), fmt.Sprintf("%s:%d", p.Name, xds.Port); got != want {
		t.Errorf("XDSRELAY_FLEET_PEERS %q, want %q", got, want)
	}
	env := map[string]string{}
	for _, kv := range containerEnv(c)[1:] {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	if got, want := env["XDSRELAY_FLEET_SELF"], net.JoinHostPort(podIP, strconv.Itoa(int(port))); got != want {
		t.Errorf("XDSRELAY_FLEET_SELF is %q in the pod, want the pod IP and the xDS port %q", got, want)
	}
	if got, want := env["XDSRELAY_ADMIN_ADVERTISE_ADDRESS"], net.JoinHostPort(podIP, strconv.Itoa(int(containerPort(c, "admin")))); got != want {
		t.Errorf("XDSRELAY_ADMIN_ADVERTISE_ADDRESS is %q in the pod, want %q", got, want)
	}
	switch {
	case m.hpa == nil && (m.deployment.Spec.Replicas == nil || *m.deployment.Spec.Replicas < 3):
		t.Errorf("replicas %v: a fleet of three", m.deployment.Spec.Replicas)
	case m.hpa != nil && *m.hpa.Spec.MinReplicas < 3:
		t.Errorf("HPA minReplicas %d: a fleet of three", *m.hpa.Spec.MinReplicas)
	case m.pdb == nil || m.pdb.Spec.MinAvailable.IntValue() < 2:
		t.Error("pdb: want minAvailable 2 or more")
	}
}

// relayContainer is the Deployment's only container.
func relayContainer(t *testing.T, d *appsv1.Deployment) corev1.Container {
	t.Helper()
	cs := d.Spec.Template.Spec.Containers
	if len(cs) != 1 {
		t.Fatalf("deployment: %d containers, want 1", len(cs))
	}
	return cs[0]
}

// relayConfig is the ConfigMap's config.yaml, parsed.
func relayConfig(t *testing.T, cm *corev1.ConfigMap) map[string]any {
	t.Helper()
	text, ok := cm.Data["config.yaml"]
	if !ok {
		t.Fatal("configmap: no config.yaml")
	}
	var cfg map[string]any
	if err := yaml.UnmarshalStrict([]byte(text), &cfg); err != nil {
		t.Fatalf("configmap: config.yaml: %v", err)
	}
	return cfg
}

// flatten maps every leaf's dotted key path to its value. An empty map is a
// leaf ({} in the file); lists are values.
func flatten(prefix string, v any) map[string]any {
	out := map[string]any{}
	mp, ok := v.(map[string]any)
	if !ok || len(mp) == 0 {
		out[prefix] = v
		return out
	}
	for k, sub := range mp {
		key := k
		if prefix != "" {
			key = prefix + "." + k
		}
		for fk, fv := range flatten(key, sub) {
			out[fk] = fv
		}
	}
	return out
}

// str is the string at a dotted key path of cfg, or "".
func str(cfg map[string]any, key string) string {
	s, _ := flatten("", cfg)[key].(string)
	return s
}

func checkListenPort(t *testing.T, cfg map[string]any, key string, want int32) {
	t.Helper()
	_, port, err := net.SplitHostPort(str(cfg, key))
	if err != nil {
		t.Errorf("%s: %v", key, err)
		return
	}
	if port != strconv.Itoa(int(want)) {
		t.Errorf("%s listens on port %s, the container port is %d", key, port, want)
	}
}

// mountedConfig is the path in the container where the ConfigMap's
// config.yaml appears.
func mountedConfig(t *testing.T, m manifests) string {
	t.Helper()
	spec := m.deployment.Spec.Template.Spec
	for _, vol := range spec.Volumes {
		cmv := vol.ConfigMap
		if cmv == nil || cmv.Name != m.config.Name {
			continue
		}
		file := "config.yaml"
		for _, it := range cmv.Items {
			if it.Key == "config.yaml" {
				file = it.Path
			}
		}
		for _, vm := range relayContainer(t, m.deployment).VolumeMounts {
			if vm.Name == vol.Name {
				return path.Join(vm.MountPath, file)
			}
		}
	}
	return fmt.Sprintf("(ConfigMap %s not mounted)", m.config.Name)
}

func envValue(c corev1.Container, name string) string {
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value
		}
	}
	return ""
}

func containerPort(c corev1.Container, name string) int32 {
	for _, p := range c.Ports {
		if p.Name == name {
			return p.ContainerPort
		}
	}
	return 0
}

func servicePort(s *corev1.Service, name string) *corev1.ServicePort {
	for i := range s.Spec.Ports {
		if s.Spec.Ports[i].Name == name {
			return &s.Spec.Ports[i]
		}
	}
	return nil
}

// imageName is an image reference without its tag or digest.
func imageName(ref string) string {
	if i := strings.LastIndexAny(ref, ":@"); i > strings.LastIndex(ref, "/") {
		return ref[:i]
	}
	return ref
}

// replaceOnce replaces old, which s must hold exactly once, with new.
func replaceOnce(t *testing.T, s, old, new string) string {
	t.Helper()
	if n := strings.Count(s, old); n != 1 {
		t.Fatalf("%q appears %d times, want once", old, n)
	}
	return strings.Replace(s, old, new, 1)
}
