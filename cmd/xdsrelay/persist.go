package main

import (
	"fmt"
	"io"
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
		Use:   "inspect FILE",
		Short: "Print what a saved cache file holds: node, and per type the resources and their versions",
		Long: `Reads one of cache.persist_dir's group-*.cache files, checking it as a restore
does (checksum, every resource, at most the default cache.persist_max_bytes),
and prints the group's node and, per type, the resources with their versions
and the names known not to exist. Exits 1 when the file does not load.`,
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			node, states, err := relay.InspectPersistFile(args[0])
			if err != nil {
				return err
			}
			return printSaved(cmd.OutOrStdout(), node, states)
		},
	})
}

// printSaved writes the node, a summary per type, then every resource.
func printSaved(w io.Writer, node *corepb.Node, states []cache.TypeState) error {
	fmt.Fprintf(w, "node: id=%s cluster=%s\n\n", orDash(node.GetId()), orDash(node.GetCluster()))
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
