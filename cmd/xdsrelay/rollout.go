package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/xdsrelay/xdsrelay/internal/xds"
)

func newRolloutCmd() *cobra.Command {
	return groupCmd(&cobra.Command{Use: "rollout", Short: "List or release the canary rollout's changes"}, newRolloutListCmd(), newRolloutReleaseCmd())
}

func newRolloutListCmd() *cobra.Command {
	return newListCmd("List the changes waiting for the canaries, and those a canary NACKed",
		`Asks the relay's admin endpoint (GET /debug/rollout/changes) for the
changes sent to the canaries and not yet to the rest of their groups: per
group, the types and resources changed, the canaries sent it and how many
ACKed, and, for a change a canary NACKed (HELD), which canary and its
error, what rollout release would release. --group and --type (changes of
that type) narrow it.`, "/debug/rollout/changes", printChangeTable)
}

func newRolloutReleaseCmd() *cobra.Command {
	return newReleaseCmd("Release changes a canary NACKed: the whole group gets them",
		`Asks the relay's admin endpoint (POST /debug/rollout/release) to release
the changes held after a canary NACKed them, overriding the canary: of one
group (its id, as xdsrelay groups shows it, or its whole key) or all,
changing one type (clusters, CDS, Cluster or a type URL) or any. They
reach the group in order, after the changes before them.`, "/debug/rollout/release", printRollouts)
}

// heldChange is a held change that was released, as the admin endpoint
// answers.
type heldChange struct {
	Group    string   `json:"group"`
	Types    []string `json:"types"`
	Names    int      `json:"resources"`
	NackedBy string   `json:"nacked_by"`
	Error    string   `json:"nack_error"`
}

func printRollouts(out io.Writer, body []byte) error {
	var released []heldChange
	if err := json.Unmarshal(body, &released); err != nil {
		return fmt.Errorf("the admin endpoint's answer: %w", err)
	}
	if len(released) == 0 {
		fmt.Fprintln(out, "nothing was held")
	}
	for _, c := range released {
		types := make([]string, len(c.Types))
		for i, t := range c.Types {
			types[i] = xds.ShortName(t)
		}
		fmt.Fprintf(out, "released a change of %d %s resources in group %q, NACKed by canary %q: %s\n",
			c.Names, strings.Join(types, ","), c.Group, c.NackedBy, c.Error)
	}
	return nil
}
