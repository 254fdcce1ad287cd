package deploy

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8syaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// The objects of one install of the relay, rendered as kubectl apply -k
// (kustomize's own Go library) or helm install (Helm's) would send them,
// and decoded strictly into the Kubernetes API types: an unknown or
// misspelt field fails.

// manifests are the objects of one install.
type manifests struct {
	source     string // how they were rendered, for messages
	config     *corev1.ConfigMap
	deployment *appsv1.Deployment
	service    *corev1.Service
	headless   *corev1.Service // the replicas' admin endpoints, one address each
	peers      *corev1.Service // the replicas' xDS endpoints, one address each: the fleet's members
	pdb        *policyv1.PodDisruptionBudget
	netpol     *networkingv1.NetworkPolicy
	account    *corev1.ServiceAccount
	hpa        *autoscalingv2.HorizontalPodAutoscaler
	monitor    *serviceMonitor
}

// serviceMonitor is the part of a prometheus-operator ServiceMonitor
// (monitoring.coreos.com/v1) the chart writes; any other field is an error.
type serviceMonitor struct {
	metav1.TypeMeta `json:",inline"`
	Metadata        metav1.ObjectMeta `json:"metadata"`
	Spec            struct {
		Selector          metav1.LabelSelector `json:"selector"`
		NamespaceSelector struct {
			MatchNames []string `json:"matchNames"`
		} `json:"namespaceSelector"`
		Endpoints []struct {
			Port      string `json:"port"`
			Path      string `json:"path"`
			Interval  string `json:"interval"`
			Scheme    string `json:"scheme"`
			TLSConfig *struct {
				CA *struct {
					Secret *corev1.SecretKeySelector `json:"secret"`
				} `json:"ca"`
				ServerName         string `json:"serverName"`
				InsecureSkipVerify bool   `json:"insecureSkipVerify"`
			} `json:"tlsConfig"`
		} `json:"endpoints"`
	} `json:"spec"`
}

// kinds are the objects an install may hold, each at most once.
func (m *manifests) target(apiVersion, kind string) (any, error) {
	slots := map[string]any{
		"v1/ConfigMap":                            &m.config,
		"apps/v1/Deployment":                      &m.deployment,
		"v1/Service":                              &m.service,
		"policy/v1/PodDisruptionBudget":           &m.pdb,
		"networking.k8s.io/v1/NetworkPolicy":      &m.netpol,
		"v1/ServiceAccount":                       &m.account,
		"autoscaling/v2/HorizontalPodAutoscaler":  &m.hpa,
		"monitoring.coreos.com/v1/ServiceMonitor": &m.monitor,
	}
	slot, ok := slots[apiVersion+"/"+kind]
	if !ok {
		return nil, errors.New("an object of an unexpected kind: " + apiVersion + " " + kind)
	}
	return slot, nil
}

// decodeObjects decodes a stream of YAML documents, one object each.
func decodeObjects(t *testing.T, source string, stream []byte) manifests {
	t.Helper()
	m := manifests{source: source}
	r := k8syaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(stream)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("%s: %v", source, err)
		}
		js, err := yaml.YAMLToJSONStrict(doc)
		if err != nil {
			t.Fatalf("%s: %v\n%s", source, err, doc)
		}
		if string(js) == "null" {
			continue // an empty document
		}
		var tm metav1.TypeMeta
		if err := json.Unmarshal(js, &tm); err != nil {
			t.Fatalf("%s: %v", source, err)
		}
		slot, err := m.target(tm.APIVersion, tm.Kind)
		if err != nil {
			t.Fatalf("%s: %v", source, err)
		}
		if tm.APIVersion == "v1" && tm.Kind == "Service" && headlessService(js) {
			slot = &m.headless
			if strings.HasSuffix(objectName(js), "-peers") {
				slot = &m.peers
			}
		}
		if !isNilSlot(slot) {
			t.Fatalf("%s: two objects of kind %s", source, tm.Kind)
		}
		dec := json.NewDecoder(bytes.NewReader(js))
		dec.DisallowUnknownFields()
		if err := dec.Decode(slot); err != nil {
			t.Fatalf("%s: %s: %v", source, tm.Kind, err)
		}
	}
	for kind, missing := range map[string]bool{"ConfigMap": m.config == nil, "Deployment": m.deployment == nil, "Service": m.service == nil,
		"headless Service": m.headless == nil} {
		if missing {
			t.Fatalf("%s: no %s", source, kind)
		}
	}
	return m
}

// headlessService reports whether a Service's JSON has clusterIP None.
func headlessService(js []byte) bool {
	var svc struct {
		Spec struct {
			ClusterIP string `json:"clusterIP"`
		} `json:"spec"`
	}
	return json.Unmarshal(js, &svc) == nil && svc.Spec.ClusterIP == corev1.ClusterIPNone
}

// objectName is an object's metadata.name, from its JSON.
func objectName(js []byte) string {
	var o struct {
		Metadata struct {
			Name string `json:"name"`
		} `json:"metadata"`
	}
	_ = json.Unmarshal(js, &o)
	return o.Metadata.Name
}

// isNilSlot reports whether the pointer slot points at a nil object.
func isNilSlot(slot any) bool {
	b, _ := json.Marshal(slot)
	return string(b) == "null"
}

// renderKustomize renders the kustomization in dir as kubectl apply -k
// does.
func renderKustomize(t *testing.T, dir string) manifests {
	t.Helper()
	res, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	out, err := res.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	return decodeObjects(t, "kustomize build "+dir, out)
}

const (
	chartDir       = "helm/xdsrelay"
	chartRelease   = "xdsrelay"
	chartNamespace = "mesh"
)

// renderChart renders the chart as helm install RELEASE --namespace NS
// with values over the chart's (strict: a template that reads a value the
// chart does not have fails).
func renderChart(t *testing.T, release, namespace string, values map[string]any) manifests {
	t.Helper()
	chrt, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	vals, err := chartutil.ToRenderValues(chrt, values,
		chartutil.ReleaseOptions{Name: release, Namespace: namespace, IsInstall: true, Revision: 1}, chartutil.DefaultCapabilities)
	if err != nil {
		t.Fatalf("helm: values: %v", err)
	}
	files, err := engine.Engine{Strict: true}.Render(chrt, vals)
	if err != nil {
		t.Fatalf("helm template: %v", err)
	}
	var stream bytes.Buffer
	for _, name := range slices.Sorted(maps.Keys(files)) {
		if strings.HasSuffix(name, "NOTES.txt") || strings.HasSuffix(name, ".tpl") {
			continue
		}
		stream.WriteString("\n---\n" + files[name])
	}
	return decodeObjects(t, "helm template "+release+" "+chartDir, stream.Bytes())
}

// chartValues reads values as helm install -f would.
func chartValues(t *testing.T, text string) map[string]any {
	t.Helper()
	v, err := chartutil.ReadValues([]byte(text))
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// baseDir holds the manifests; deploy/'s kustomization names it.
const baseDir = "base"

// manifestFiles are the manifests' files, by name (base's kustomization's
// resources).
func manifestFiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(baseDir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range files {
		if name := filepath.Base(f); name != "kustomization.yaml" {
			names = append(names, name)
		}
	}
	return names
}

// decodeFile decodes one of the manifests' files, which must hold one
// object.
func decodeFile(t *testing.T, file string) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(baseDir, file))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(data, []byte("\n---")) {
		t.Fatalf("%s: more than one document; keep one object per file", file)
	}
	var m manifests
	js, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	var tm metav1.TypeMeta
	if err := json.Unmarshal(js, &tm); err != nil {
		t.Fatal(err)
	}
	slot, err := m.target(tm.APIVersion, tm.Kind)
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	if err := dec.Decode(slot); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
}
