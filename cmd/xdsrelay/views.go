package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/xdsrelay/xdsrelay/internal/xds"
)

// The read-only views of the admin endpoint, as commands: one client's
// config dump, the guard's holds and the rollout's changes. They take the
// admin endpoint as --admin, and read what a private caller may: on the
// pod itself (kubectl exec, or kubectl port-forward to the local admin
// listener) no certificate is needed (docs/operations.md, "Admin
// exposure").

func newConfigDumpCmd() *cobra.Command {
	var (
		af        adminFlags
		node, typ string
	)
	cmd := &cobra.Command{
		Use:   "config-dump --admin ADMIN_ADDR --node ID [--type T]",
		Short: "Print what one client holds through the relay, as Envoy's /config_dump",
		Long: `Asks the relay's admin endpoint (GET /debug/config_dump) what each live
stream of the client with node id ID holds and prints it as JSON: per
stream its group and variant, and its config dump in the JSON form of
Envoy's /config_dump (envoy.admin.v3.ConfigDump: ClustersConfigDump,
ListenersConfigDump, RoutesConfigDump, EndpointsConfigDump, ...), each
resource as the client was sent it, with its version and status; the
names without a body (not sent, DOES_NOT_EXIST, NACKED with the client's
error) as CSDS shows them. --type narrows it to one type (clusters, CDS,
Cluster or a type URL). Exit 1 when no client with that id is connected.`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := af.check(cmd); err != nil {
				return err
			}
			if err := required(cmd, "node"); err != nil {
				return err
			}
			q := url.Values{"node": {node}}
			if typ != "" {
				typeURL, err := xds.ParseType(typ)
				if err != nil {
					return usageError{cmd, fmt.Errorf("--type: %w", err)}
				}
				q.Set("type", typeURL)
			}
			b, err := af.do(cmd.Context(), http.MethodGet, "/debug/config_dump", q, "")
			if err != nil {
				return err
			}
			_, err = cmd.OutOrStdout().Write(b)
			return err
		},
	}
	af.add(cmd)
	cmd.Flags().StringVar(&node, "node", "", "the client's node `ID`, as /debug/clients and status list it (required)")
	cmd.Flags().StringVar(&typ, "type", "", "only this `TYPE`: clusters, Cluster, cds or a type URL (every type without it)")
	return cmd
}

// newListCmd is a "list" subcommand: it GETs path on the admin endpoint,
// narrowed by --group and --type as a release is, and prints the answer as
// a table with table, or as the endpoint's JSON with -o json.
func newListCmd(short, long, path string, table func(io.Writer, []byte) error) *cobra.Command {
	var (
		af                 adminFlags
		group, typ, output string
	)
	cmd := &cobra.Command{
		Use:   "list --admin ADMIN_ADDR [--group G] [--type T] [-o table|json]",
		Short: short,
		Long:  long,
		Args:  usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if output != "table" && output != "json" {
				return usageError{cmd, fmt.Errorf("-o: %q is not table or json", output)}
			}
			if err := af.check(cmd); err != nil {
				return err
			}
			q, err := scopeQuery(cmd, group, typ)
			if err != nil {
				return err
			}
			b, err := af.do(cmd.Context(), http.MethodGet, path, q, "")
			if err != nil {
				return err
			}
			if output == "json" {
				_, err = cmd.OutOrStdout().Write(b)
				return err
			}
			return table(cmd.OutOrStdout(), b)
		},
	}
	af.add(cmd)
	addReleaseFlags(cmd, &group, &typ)
	cmd.Flags().StringVarP(&output, "output", "o", "table", "`FORMAT`: table, or json (the admin endpoint's answer)")
	return cmd
}

// holdRow is one hold, as GET /debug/guard/holds answers.
type holdRow struct {
	Group string    `json:"group"`
	Type  string    `json:"type"`
	Since time.Time `json:"since"`
	Names int       `json:"names"`
	Wipe  bool      `json:"wipe"`
}

// printHoldTable prints the guard's holds, one a row.
func printHoldTable(out io.Writer, body []byte) error {
	var holds []holdRow
	if err := json.Unmarshal(body, &holds); err != nil {
		return fmt.Errorf("the admin endpoint's answer: %w", err)
	}
	if len(holds) == 0 {
		fmt.Fprintln(out, "nothing is held")
		return nil
	}
	return writeTable(out, []string{"GROUP", "TYPE", "REMOVALS HELD", "SINCE", "WIPE"}, len(holds), func(i int) []string {
		h := holds[i]
		return []string{h.Group, xds.TypeAbbrev(h.Type), strconv.Itoa(h.Names), h.Since.UTC().Format(time.RFC3339), yesNo(h.Wipe)}
	})
}

// changeRow is one change, as GET /debug/rollout/changes answers.
type changeRow struct {
	Group    string    `json:"group"`
	Since    time.Time `json:"since"`
	Types    []string  `json:"types"`
	Names    int       `json:"resources"`
	Canaries int       `json:"canaries"`
	Acked    int       `json:"acked"`
	Held     bool      `json:"held"`
	NackedBy string    `json:"nacked_by"`
	Error    string    `json:"nack_error"`
}

// printChangeTable prints the rollout's changes, one a row.
func printChangeTable(out io.Writer, body []byte) error {
	var changes []changeRow
	if err := json.Unmarshal(body, &changes); err != nil {
		return fmt.Errorf("the admin endpoint's answer: %w", err)
	}
	if len(changes) == 0 {
		fmt.Fprintln(out, "no change waits for the canaries")
		return nil
	}
	return writeTable(out, []string{"GROUP", "TYPES", "RESOURCES", "CANARIES", "ACKED", "HELD", "SINCE", "NACKED BY", "ERROR"}, len(changes), func(i int) []string {
		c := changes[i]
		types := make([]string, len(c.Types))
		for j, t := range c.Types {
			types[j] = xds.TypeAbbrev(t)
		}
		return []string{c.Group, strings.Join(types, ","), strconv.Itoa(c.Names), strconv.Itoa(c.Canaries), strconv.Itoa(c.Acked),
			yesNo(c.Held), c.Since.UTC().Format(time.RFC3339), orDash(c.NackedBy), orDash(c.Error)}
	})
}

// writeTable writes a header and n rows, aligned; a cell's tabs and line
// breaks (a peer's text) are spaces.
func writeTable(out io.Writer, header []string, n int, row func(int) []string) error {
	var b bytes.Buffer
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(header, "\t"))
	clean := strings.NewReplacer("\t", " ", "\n", " ", "\r", " ")
	for i := range n {
		cells := row(i)
		for j, c := range cells {
			cells[j] = clean.Replace(c)
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := out.Write(b.Bytes())
	return err
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}
