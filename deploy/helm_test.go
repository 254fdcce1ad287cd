package deploy

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	"helm.sh/helm/v3/pkg/strvals"
)

// helm lint passes on the chart, with its defaults and with other values:
// Chart.yaml, values.yaml and every template as Helm checks them (strict
// rendering, YAML, the objects' names).
func TestChartLint(t *testing.T) {
	for name, values := range map[string]map[string]any{"defaults": nil, "other values": chartValues(t, nonDefaultValues)} {
		linter := lint.All(chartDir, values, chartNamespace, false)
		for _, msg := range linter.Messages {
			if msg.Severity >= support.WarningSev {
				t.Errorf("helm lint (%s): %s", name, msg)
			} else {
				t.Logf("helm lint (%s): %s", name, msg)
			}
		}
	}
}

// The README's Kubernetes section, and docs/kubernetes.md's, install the
// relay two ways, kustomize (kubectl apply -k) and Helm (helm install):
// each command they show renders, as that tool would, to an install that
// follows the rules (TestInstalls) and whose configuration `xdsrelay
// validate` accepts.
func TestDocumentedInstalls(t *testing.T) {
	bin := relayBinary(t)
	for _, doc := range []string{"README.md", "docs/kubernetes.md"} {
		t.Run(doc, func(t *testing.T) { checkInstallCommands(t, bin, doc) })
	}
}

func checkInstallCommands(t *testing.T, bin, doc string) {
	var kustomize, helm int
	for _, line := range docCommands(t, doc, "Kubernetes") {
		words := strings.Fields(line)
		var m manifests
		switch {
		case len(words) >= 4 && words[0] == "kubectl" && words[1] == "apply" && words[2] == "-k":
			kustomize++
			m = renderKustomize(t, filepath.Join("..", words[3]))
		case len(words) >= 3 && words[0] == "helm" && (words[1] == "install" || words[1] == "upgrade"):
			helm++
			m = helmInstall(t, words[2:])
		default:
			continue
		}
		t.Run(line, func(t *testing.T) { checkInstall(t, bin, m) })
	}
	if kustomize == 0 || helm == 0 {
		t.Fatalf("%s's Kubernetes section shows %d kubectl apply -k and %d helm install commands, want both", doc, kustomize, helm)
	}
}

// helmInstall renders `helm install|upgrade [--install] RELEASE CHART
// [flags]` (from the repository root) as Helm would: --namespace, --set
// and --values/-f; other flags do not change the objects.
func helmInstall(t *testing.T, args []string) manifests {
	t.Helper()
	var pos, sets []string
	namespace := "default"
	values := map[string]any{}
	for i := 0; i < len(args); i++ {
		flag, val, hasVal := strings.Cut(args[i], "=")
		next := func() string {
			if hasVal {
				return val
			}
			i++
			if i == len(args) {
				t.Fatalf("helm: %s wants a value", flag)
			}
			return args[i]
		}
		switch flag {
		case "--namespace", "-n":
			namespace = next()
		case "--set":
			sets = append(sets, next())
		case "--values", "-f":
			b, err := os.ReadFile(filepath.Join("..", next()))
			if err != nil {
				t.Fatal(err)
			}
			values = chartutil.CoalesceTables(chartValues(t, string(b)), values)
		default:
			if !strings.HasPrefix(flag, "-") {
				pos = append(pos, args[i])
			}
		}
	}
	for _, set := range sets { // after the files, as Helm does
		if err := strvals.ParseInto(set, values); err != nil {
			t.Fatalf("helm --set: %v", err)
		}
	}
	if len(pos) != 2 || filepath.Clean(pos[1]) != filepath.Join("deploy", chartDir) {
		t.Fatalf("helm: want RELEASE deploy/%s, got %q", chartDir, pos)
	}
	return renderChart(t, pos[0], namespace, values)
}

// docCommands are the commands of the sh blocks of a section of doc, a
// Markdown file named from the repository root (lines joined at a
// trailing backslash, comments dropped).
func docCommands(t *testing.T, doc, section string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", doc))
	if err != nil {
		t.Fatal(err)
	}
	_, text, ok := strings.Cut(string(b), "\n## "+section+"\n")
	if !ok {
		t.Fatalf("%s: no %s section", doc, section)
	}
	if i := strings.Index(text, "\n## "); i >= 0 {
		text = text[:i]
	}
	var out []string
	blocks := strings.Split(text, "```sh\n")
	for _, blk := range blocks[1:] {
		code, _, _ := strings.Cut(blk, "```")
		for _, line := range strings.Split(strings.ReplaceAll(code, "\\\n", " "), "\n") {
			line, _, _ = strings.Cut(line, "#")
			if line = strings.Join(strings.Fields(line), " "); line != "" {
				out = append(out, line)
			}
		}
	}
	return out
}
