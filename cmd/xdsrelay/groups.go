package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
)

func newGroupsCmd() *cobra.Command {
	var (
		af     adminFlags
		output string
	)
	cmd := &cobra.Command{
		Use:   "groups --admin ADMIN_ADDR [-o table|json]",
		Short: "List the groups: each one's id, clients, upstream and whole key",
		Long: `Reads the relay's admin endpoint (GET /debug/groups) and prints, per group,
the id that the logs, the metrics' group label, /readyz, the /debug/ paths,
status --summary, wait and persist inspect name it by, how many clients it
has, the upstream it is fetched from (each upstream's server and whether
its stream is up) and its whole key (the values of upstream.group_by's
fields). -o json prints the admin endpoint's answer. The admin endpoint
must be private to the caller, as for xdsrelay admin.`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := af.check(cmd); err != nil {
				return err
			}
			if output != "table" && output != "json" {
				return usageError{cmd, fmt.Errorf("-o: %q is not table or json", output)}
			}
			b, err := af.do(cmd.Context(), http.MethodGet, "/debug/groups", nil, "")
			if err != nil {
				return err
			}
			if output == "json" {
				_, err = cmd.OutOrStdout().Write(b)
				return err
			}
			return printGroups(cmd.OutOrStdout(), b)
		},
	}
	af.add(cmd)
	cmd.Flags().StringVarP(&output, "output", "o", "table", "`FORMAT`: table or json")
	return cmd
}

// shownGroup is what groups prints of /debug/groups' answer.
type shownGroup struct {
	ID        string `json:"id"`
	Key       string `json:"key"`
	Clients   int    `json:"clients"`
	Upstreams []struct {
		Name      string `json:"name"`
		Server    string `json:"server"`
		Connected bool   `json:"connected"`
		LastError string `json:"last_error"`
	} `json:"upstreams"`
}

// printGroups writes one row per group: id, clients, upstream, key.
func printGroups(w io.Writer, body []byte) error {
	var gs []shownGroup
	if err := json.Unmarshal(body, &gs); err != nil {
		return fmt.Errorf("the admin endpoint's answer: %w", err)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tCLIENTS\tUPSTREAM\tKEY")
	for _, g := range gs {
		ups := make([]string, 0, len(g.Upstreams))
		for _, u := range g.Upstreams {
			state := "up"
			if !u.Connected {
				state = "down"
			}
			ups = append(ups, fmt.Sprintf("%s %s %s", u.Name, orDash(u.Server), state))
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\n", g.ID, g.Clients, orDash(strings.Join(ups, "; ")), g.Key)
	}
	return tw.Flush()
}
