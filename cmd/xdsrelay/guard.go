package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"github.com/spf13/cobra"

	"github.com/xdsrelay/xdsrelay/internal/xds"
)

func newGuardCmd() *cobra.Command {
	return groupCmd(&cobra.Command{Use: "guard", Short: "List or release the mass-removal guard's holds"}, newGuardListCmd(), newGuardReleaseCmd())
}

func newGuardListCmd() *cobra.Command {
	return newListCmd("List the removals the guard holds",
		`Asks the relay's admin endpoint (GET /debug/guard/holds) for the guard's
holds, what guard release would end: per group and type, the removals
held, since when, and whether it is a wipe's short hold. --group (the
group's id, as xdsrelay groups shows it, or its whole key) and --type
narrow it.`, "/debug/guard/holds", printHoldTable)
}

func newGuardReleaseCmd() *cobra.Command {
	return newReleaseCmd("Release held removals: the clients get them now",
		`Asks the relay's admin endpoint (POST /debug/guard/release) to end the
guard's holds and apply their removals: of one group (its id, as
xdsrelay groups and /debug/groups show it, or its whole key) or all, of
one type (endpoints, EDS, ClusterLoadAssignment or a type URL) or all.`, "/debug/guard/release", printHolds)
}

// newReleaseCmd is a "release" subcommand: it POSTs path on the admin
// endpoint, narrowed by --group and --type, and prints the answer with
// print. The guard's and the rollout's differ only in these.
func newReleaseCmd(short, long, path string, print func(io.Writer, []byte) error) *cobra.Command {
	var (
		af         adminFlags
		group, typ string
	)
	cmd := &cobra.Command{
		Use:   "release --admin ADMIN_ADDR [--group G] [--type T]",
		Short: short,
		Long: long + ` The admin endpoint must be private to the caller:
loopback, or admin.tls with a client certificate (--ca-file, --cert-file,
--key-file; --server-name through kubectl port-forward).`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := af.check(cmd); err != nil {
				return err
			}
			q, err := releaseQuery(cmd, group, typ)
			if err != nil {
				return err
			}
			b, err := af.do(cmd.Context(), http.MethodPost, path, q, "")
			if err != nil {
				return err
			}
			return print(cmd.OutOrStdout(), b)
		},
	}
	af.addWithServer(cmd)
	addReleaseFlags(cmd, &group, &typ)
	return cmd
}

// addReleaseFlags adds --group and --type, which narrow a release.
func addReleaseFlags(cmd *cobra.Command, group, typ *string) {
	cmd.Flags().StringVar(group, "group", "", "only the group with this `ID` (as xdsrelay groups shows it) or whole key (all groups without it)")
	cmd.Flags().StringVar(typ, "type", "", "only this `TYPE`: clusters, Cluster, cds or a type URL, as watch --type (all types without it)")
}

// releaseQuery checks a release's flags and makes its query.
func releaseQuery(cmd *cobra.Command, group, typ string) (url.Values, error) {
	return scopeQuery(cmd, group, typ)
}

// scopeQuery is the query of --group and --type, which narrow a release
// or a list.
func scopeQuery(cmd *cobra.Command, group, typ string) (url.Values, error) {
	q := url.Values{}
	if typ != "" {
		typeURL, err := xds.ParseType(typ)
		if err != nil {
			return nil, usageError{cmd, fmt.Errorf("--type: %w", err)}
		}
		q.Set("type", typeURL)
	}
	if group != "" {
		q.Set("group", group)
	}
	return q, nil
}

// heldRelease is one hold that ended, as the admin endpoint answers.
type heldRelease struct {
	Group string `json:"group"`
	Type  string `json:"type"`
	Names int    `json:"names"`
}

func printHolds(out io.Writer, body []byte) error {
	var released []heldRelease
	if err := json.Unmarshal(body, &released); err != nil {
		return fmt.Errorf("the admin endpoint's answer: %w", err)
	}
	if len(released) == 0 {
		fmt.Fprintln(out, "nothing was held")
	}
	for _, h := range released {
		fmt.Fprintf(out, "released %d removals of %s in group %q\n", h.Names, xds.ShortName(h.Type), h.Group)
	}
	return nil
}
