package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"text/tabwriter"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/spf13/cobra"

	"github.com/xdsrelay/xdsrelay/cache"
	"github.com/xdsrelay/xdsrelay/internal/xds"
	"github.com/xdsrelay/xdsrelay/relay"
)

func newPersistCmd() *cobra.Command {
	return groupCmd(&cobra.Command{
		Use:   "persist",
		Short: "Look into the caches saved in cache.persist_dir",
	}, &cobra.Command{
		Use:   "inspect FILE|DIR",
		Short: "Print what saved cache files hold: node, and per type the resources and their versions",
		Long: `Reads one of cache.persist_dir's group-*.cache files, or every one in DIR (the
cache.persist_dir itself), checking each as a restore does (checksum, every
resource, at most the default cache.persist_max_bytes), and prints the
group's node and, per type, the resources with their versions and the names
known not to exist. Exits 1 when a file does not load (the others are
printed) or DIR holds none.`,
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			files, err := savedFiles(args[0])
			if err != nil {
				return err
			}
			if len(files) == 1 && files[0] == args[0] {
				return inspectFile(cmd.OutOrStdout(), files[0])
			}
			failed := 0
			for i, f := range files {
				if i > 0 {
					fmt.Fprintln(cmd.OutOrStdout())
				}
				fmt.Fprintf(cmd.OutOrStdout(), "== %s\n", f)
				if err := inspectFile(cmd.OutOrStdout(), f); err != nil {
					fmt.Fprintln(cmd.ErrOrStderr(), "xdsrelay:", err)
					failed++
				}
			}
			if failed > 0 {
				return fmt.Errorf("%s: %d of %d saved caches did not load", args[0], failed, len(files))
			}
			return nil
		},
	})
}

// savedFiles is path, a file, or the saved caches in path, a directory.
func savedFiles(path string) ([]string, error) {
	fi, err := os.Stat(path)
	if err != nil || !fi.IsDir() {
		return []string{path}, nil // InspectPersistFile says what is wrong
	}
	files, err := filepath.Glob(filepath.Join(path, relay.PersistFilePattern))
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("%s: no saved caches (%s) in the directory", path, relay.PersistFilePattern)
	}
	return files, nil
}

func inspectFile(w io.Writer, path string) error {
	node, states, err := relay.InspectPersistFile(path)
	if err != nil {
		return err
	}
	return printSaved(w, node, states)
}

// printSaved writes the group (its id and whole key), the node, a summary
// per type, then every resource.
func printSaved(w io.Writer, node *corepb.Node, states []cache.TypeState) error {
	if key := relay.SavedKey(node); key != "" {
		fmt.Fprintf(w, "group: %s\nkey: %s\n", relay.GroupID(key), xds.Clip(key))
	} else {
		fmt.Fprintln(w, "group: - (the file was saved before saved caches named their group)")
	}
	id := relay.SavedUpstreamID(node)
	if id == "" {
		id = node.GetId() // saved before the id presented was kept: the clients' own, if id is a group_by field
	}
	fmt.Fprintf(w, "upstream node: id=%s cluster=%s\n\n", orDash(xds.Clip(id)), orDash(node.GetCluster()))
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TYPE\tRESOURCES\tABSENT\tWILDCARD")
	for _, ts := range states {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\n", xds.TypeAbbrev(ts.TypeURL), len(ts.Resources), len(ts.Absent), wildcard(ts))
	}
	fmt.Fprintln(tw, "\nTYPE\tNAME\tVERSION")
	for _, ts := range states {
		for _, r := range ts.Resources {
			fmt.Fprintf(tw, "%s\t%s\t%s\n", xds.TypeAbbrev(ts.TypeURL), r.Name, orDash(r.Version))
		}
		for _, n := range ts.Absent {
			fmt.Fprintf(tw, "%s\t%s\t(does not exist)\n", xds.TypeAbbrev(ts.TypeURL), n)
		}
	}
	return tw.Flush()
}

func wildcard(ts cache.TypeState) string {
	switch {
	case ts.Synced:
		return "synced"
	case ts.Wildcard:
		return "yes"
	default:
		return "no"
	}
}
