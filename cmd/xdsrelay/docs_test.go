package main

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// config.example.yaml names every key (set, or shown in a comment) and sets
// no key the relay lacks.
func TestExampleConfigNamesEveryKey(t *testing.T) {
	text, err := os.ReadFile("../../config.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	known := settingsByKey(new(Options))
	live, all := yamlKeys(string(text), known)
	for key := range known {
		if !all[key] {
			t.Errorf("config.example.yaml does not show %s", key)
		}
	}
	for key := range live {
		if _, ok := known[key]; !ok && !underKey(key, known) {
			t.Errorf("config.example.yaml sets %s, which is not a key", key)
		}
	}
}

// docs/configuration.md has a row for every key, with the key's default as
// the relay has it, and no row for a key the relay lacks. (The file is
// written from the key table; this holds what it says to the relay itself.)
func TestConfigurationDocDocumentsEveryKey(t *testing.T) {
	text, err := os.ReadFile("../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	def := defaultOptions()
	known := settingsByKey(&def)
	rows := documentedKeys(t, string(text))
	for key, s := range known {
		got, ok := rows[key]
		if !ok {
			t.Errorf("docs/configuration.md: no row for %s", key)
			continue
		}
		if want := formatValue(s); got != want {
			t.Errorf("docs/configuration.md: %s defaults to %q, the relay to %q", key, got, want)
		}
	}
	for key := range rows {
		if _, ok := known[key]; !ok {
			t.Errorf("docs/configuration.md: a row for %s, which is not a key", key)
		}
	}
}

var yamlLine = regexp.MustCompile(`^( *)(# *)?([a-z_]+):(.*)$`)

// yamlKeys returns the dotted keys text sets (live) and those it sets or
// shows in a comment (all), by indentation.
func yamlKeys(text string, known map[string]setting) (live, all map[string]bool) {
	live, all = map[string]bool{}, map[string]bool{}
	type section struct {
		indent int
		name   string
	}
	var stack []section
	for _, line := range strings.Split(text, "\n") {
		m := yamlLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		indent, commented, rest := len(m[1]), m[2] != "", strings.TrimSpace(m[4])
		for len(stack) > 0 && stack[len(stack)-1].indent >= indent {
			stack = stack[:len(stack)-1]
		}
		path := m[3]
		if len(stack) > 0 {
			path = stack[len(stack)-1].name + "." + m[3]
		}
		all[path] = true
		switch {
		case commented:
		case rest == "" || strings.HasPrefix(rest, "#"):
			stack = append(stack, section{indent, path})
			if _, ok := known[path]; ok {
				live[path] = true // a map written as a block
			}
		default:
			live[path] = true
		}
	}
	return live, all
}

// underKey reports whether key is inside a key's value (upstream.headers.x).
func underKey(key string, known map[string]setting) bool {
	for k := range known {
		if strings.HasPrefix(key, k+".") {
			return true
		}
	}
	return false
}

var keyRow = regexp.MustCompile("^\\| *`([a-z_.]+)` *\\| *[^|]*?\\| *([^|]*?) *\\|")

// documentedKeys returns the keys in docs/configuration.md's tables of the
// relay's keys (an upstreams entry's keys aside), with the default each row
// gives ("empty" or the value without backquotes).
func documentedKeys(t *testing.T, text string) map[string]string {
	text, _, _ = strings.Cut(text, "\n## Keys of an `upstreams` entry")
	rows := map[string]string{}
	for _, line := range strings.Split(text, "\n") {
		if m := keyRow.FindStringSubmatch(line); m != nil {
			rows[m[1]] = strings.Trim(m[2], "`")
		}
	}
	if len(rows) == 0 {
		t.Fatal("docs/configuration.md: no table of keys")
	}
	return rows
}

// docs/cli.md's synopsis names every command the binary has, and no other;
// and its table has a row for each.
func TestCLIDocNamesEveryCommand(t *testing.T) {
	text, err := os.ReadFile("../../docs/cli.md")
	if err != nil {
		t.Fatal(err)
	}
	_, synopsis, _ := strings.Cut(string(text), "## Command line\n\n```sh\n")
	synopsis, _, _ = strings.Cut(synopsis, "```")
	documented := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(synopsis), "\n") {
		var path []string
		for _, w := range strings.Fields(line)[1:] {
			if strings.HasPrefix(w, "-") || strings.Contains(w, "[") || strings.ToUpper(w) == w {
				break
			}
			path = append(path, w)
		}
		documented[strings.Join(path, " ")] = true
	}
	var walk func(c *cobra.Command, prefix string)
	have := map[string]bool{"": true} // xdsrelay [serve]: the root runs the relay
	walk = func(c *cobra.Command, prefix string) {
		for _, sub := range c.Commands() {
			if sub.Hidden || sub.Name() == "help" || sub.Name() == "completion" {
				continue
			}
			name := strings.TrimSpace(prefix + " " + sub.Name())
			if sub.HasSubCommands() {
				walk(sub, name)
				continue
			}
			have[name] = true
		}
	}
	walk(newRootCmd(nil), "")
	delete(have, "serve") // shown as xdsrelay [serve]
	for name := range have {
		if !documented[name] {
			t.Errorf("docs/cli.md: no synopsis for xdsrelay %s", name)
		}
		if name != "" && !strings.Contains(string(text), "| `"+name) {
			t.Errorf("docs/cli.md: no row for %s", name)
		}
	}
	for name := range documented {
		if !have[name] {
			t.Errorf("docs/cli.md: xdsrelay %s, which is not a command", name)
		}
	}
}
