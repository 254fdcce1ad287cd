package deploy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"
)

// upstreamEnv is where the Deployment names the control plane.
const upstreamEnv = "XDSRELAY_UPSTREAM_ADDRESS"

// manifests is every object in deploy/, decoded.
type manifests struct {
	config     *corev1.ConfigMap
	deployment *appsv1.Deployment
	service    *corev1.Service
	pdb        *policyv1.PodDisruptionBudget
}

// kustomization is the part of a kustomize.config.k8s.io Kustomization this
// directory uses; any other field is an error.
type kustomization struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Resources  []string `json:"resources"`
}

// decodeStrict decodes the one YAML document in file into out, refusing
// fields that out does not have and duplicate keys.
func decodeStrict(t *testing.T, file string, out any) {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(data, []byte("\n---")) {
		t.Fatalf("%s: more than one document; keep one object per file", file)
	}
	js, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	if err := dec.Decode(out); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
}

// checkKind fails unless tm says gvk.
func checkKind(t *testing.T, file string, tm metav1.TypeMeta, gvk schema.GroupVersionKind) {
	t.Helper()
	if got := tm.GroupVersionKind(); got != gvk {
		t.Errorf("%s: apiVersion/kind %v, want %v", file, got, gvk)
	}
}

func load(t *testing.T) manifests {
	t.Helper()
	m := manifests{
		config:     &corev1.ConfigMap{},
		deployment: &appsv1.Deployment{},
		service:    &corev1.Service{},
		pdb:        &policyv1.PodDisruptionBudget{},
	}
	decodeStrict(t, "configmap.yaml", m.config)
	checkKind(t, "configmap.yaml", m.config.TypeMeta, corev1.SchemeGroupVersion.WithKind("ConfigMap"))
	decodeStrict(t, "deployment.yaml", m.deployment)
	checkKind(t, "deployment.yaml", m.deployment.TypeMeta, appsv1.SchemeGroupVersion.WithKind("Deployment"))
	decodeStrict(t, "service.yaml", m.service)
	checkKind(t, "service.yaml", m.service.TypeMeta, corev1.SchemeGroupVersion.WithKind("Service"))
	decodeStrict(t, "pdb.yaml", m.pdb)
	checkKind(t, "pdb.yaml", m.pdb.TypeMeta, policyv1.SchemeGroupVersion.WithKind("PodDisruptionBudget"))
	return m
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

func TestKustomizationListsEveryManifest(t *testing.T) {
	var k kustomization
	decodeStrict(t, "kustomization.yaml", &k)
	if k.APIVersion != "kustomize.config.k8s.io/v1beta1" || k.Kind != "Kustomization" {
		t.Errorf("kustomization.yaml: apiVersion/kind %s %s", k.APIVersion, k.Kind)
	}
	files, err := filepath.Glob("*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	files = slices.DeleteFunc(files, func(f string) bool { return f == "kustomization.yaml" })
	got := slices.Sorted(slices.Values(k.Resources))
	if !slices.Equal(got, files) {
		t.Errorf("kustomization.yaml resources %v, want the manifests %v", got, files)
	}
}

func TestSelectorsMatchPodLabels(t *testing.T) {
	m := load(t)
	pod := labels.Set(m.deployment.Spec.Template.Labels)
	selectors := map[string]*metav1.LabelSelector{
		"deployment": m.deployment.Spec.Selector,
		"pdb":        m.pdb.Spec.Selector,
		"service":    {MatchLabels: m.service.Spec.Selector},
	}
	for name, ls := range selectors {
		sel, err := metav1.LabelSelectorAsSelector(ls)
		if err != nil {
			t.Fatalf("%s: selector: %v", name, err)
		}
		if sel.Empty() || !sel.Matches(pod) {
			t.Errorf("%s: selector %q does not match the pod labels %v", name, sel, pod)
		}
	}
}

func TestDeployment(t *testing.T) {
	m := load(t)
	d := m.deployment
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 2 {
		t.Errorf("replicas %v, want 2", d.Spec.Replicas)
	}
	if d.Spec.Strategy.Type != appsv1.RollingUpdateDeploymentStrategyType {
		t.Errorf("strategy %q, want RollingUpdate", d.Spec.Strategy.Type)
	}
	c := relayContainer(t, d)
	if want := []string{"--config", "/etc/xdsrelay/config.yaml"}; !slices.Equal(c.Args, want) {
		t.Errorf("args %q, want %q", c.Args, want)
	}
	if v := envValue(c, upstreamEnv); v == "" {
		t.Errorf("no %s: the ConfigMap leaves the control plane to it", upstreamEnv)
	}
	for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		if _, ok := c.Resources.Requests[r]; !ok {
			t.Errorf("no %s request", r)
		}
		if _, ok := c.Resources.Limits[r]; !ok {
			t.Errorf("no %s limit", r)
		}
	}
}

func TestDeploymentSecurityContext(t *testing.T) {
	m := load(t)
	c := relayContainer(t, m.deployment)
	sc := c.SecurityContext
	if sc == nil {
		t.Fatal("container: no securityContext")
	}
	flags := map[string]*bool{
		"runAsNonRoot":           sc.RunAsNonRoot,
		"readOnlyRootFilesystem": sc.ReadOnlyRootFilesystem,
	}
	for name, v := range flags {
		if v == nil || !*v {
			t.Errorf("securityContext.%s not true", name)
		}
	}
	if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Error("securityContext.allowPrivilegeEscalation not false")
	}
}

func TestProbesAndServiceNameContainerPorts(t *testing.T) {
	m := load(t)
	c := relayContainer(t, m.deployment)
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	if ports["xds"] != 18001 || ports["admin"] != 9901 {
		t.Errorf("container ports %v, want xds 18001 and admin 9901", ports)
	}
	probes := map[string]struct {
		probe *corev1.Probe
		path  string
	}{
		"readinessProbe": {c.ReadinessProbe, "/readyz"},
		"livenessProbe":  {c.LivenessProbe, "/healthz"},
	}
	for name, p := range probes {
		if p.probe == nil || p.probe.HTTPGet == nil {
			t.Errorf("%s: no httpGet", name)
			continue
		}
		get := p.probe.HTTPGet
		if get.Path != p.path || get.Port != intstr.FromString("admin") {
			t.Errorf("%s: %s on port %v, want %s on port admin", name, get.Path, get.Port.String(), p.path)
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
	if servicePort(m.service, "admin") == nil {
		t.Error("service: no admin port")
	}
}

func TestConfigMatchesContainer(t *testing.T) {
	m := load(t)
	c := relayContainer(t, m.deployment)
	cfg := relayConfig(t, m.config)
	checkListenPort(t, cfg, "admin.address", containerPort(c, "admin"))
	checkListenPort(t, cfg, "downstream.address", containerPort(c, "xds"))
	if host, _, _ := net.SplitHostPort(str(cfg, "admin.address")); host != "0.0.0.0" {
		t.Errorf("admin.address %q: the kubelet's probes need all interfaces", str(cfg, "admin.address"))
	}
	if got := mountedConfig(t, m); got != c.Args[len(c.Args)-1] {
		t.Errorf("the ConfigMap's config.yaml is mounted at %q, the relay reads %q", got, c.Args[len(c.Args)-1])
	}
	// README, Shutdown: shutdown_timeout for streams, then as long again.
	shutdown, err := time.ParseDuration(str(cfg, "shutdown_timeout"))
	if err != nil {
		t.Fatalf("shutdown_timeout: %v", err)
	}
	grace := m.deployment.Spec.Template.Spec.TerminationGracePeriodSeconds
	if grace == nil || time.Duration(*grace)*time.Second <= 2*shutdown {
		t.Errorf("terminationGracePeriodSeconds %v, want more than twice shutdown_timeout (%v)", grace, shutdown)
	}
	if m.pdb.Spec.MinAvailable == nil || m.pdb.Spec.MinAvailable.IntValue() != 1 {
		t.Errorf("pdb: minAvailable %v, want 1", m.pdb.Spec.MinAvailable)
	}
}

// TestConfigInSyncWithExample keeps the ConfigMap's config.yaml the
// example's: the same keys, the same values but for the two it must change.
func TestConfigInSyncWithExample(t *testing.T) {
	m := load(t)
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
