package main

import (
	"os"
	"regexp"
	"strings"
	"testing"
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

// The README's configuration table has a row for every key, with the key's
// default, and no row for a key the relay lacks.
func TestREADMEDocumentsEveryKey(t *testing.T) {
	text, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	def := defaultOptions()
	known := settingsByKey(&def)
	rows := readmeKeys(t, string(text))
	for key, s := range known {
		got, ok := rows[key]
		if !ok {
			t.Errorf("README: no row for %s", key)
			continue
		}
		if want := formatValue(s); got != want {
			t.Errorf("README: %s defaults to %q, the relay to %q", key, got, want)
		}
	}
	for key := range rows {
		if _, ok := known[key]; !ok {
			t.Errorf("README: a row for %s, which is not a key", key)
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

var (
	readmeRow  = regexp.MustCompile("^\\| *(`[^|]*) *\\| *([^|]*?) *\\|")
	backquoted = regexp.MustCompile("`([^`]*)`")
)

// readmeKeys returns the keys in the README's configuration table, with the
// default each row gives ("empty" or the value without backquotes).
func readmeKeys(t *testing.T, text string) map[string]string {
	_, section, ok := strings.Cut(text, "\n## Configuration\n")
	if !ok {
		t.Fatal("README: no Configuration section")
	}
	section, _, _ = strings.Cut(section, "\n#")
	rows := map[string]string{}
	for _, line := range strings.Split(section, "\n") {
		m := readmeRow.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		def := strings.Trim(m[2], "`")
		for _, k := range backquoted.FindAllStringSubmatch(m[1], -1) {
			rows[k[1]] = def
		}
	}
	if len(rows) == 0 {
		t.Fatal("README: no configuration table")
	}
	return rows
}
