package loadtest

import (
	"context"
	"fmt"
	"io"
	"time"
)

// Ending is how a run's clients ended: once the control plane's changes
// stopped, how long until each held the last version of every name it
// subscribes to, and what they were told on the way.
type Ending struct {
	// Names is what was checked: every client's subscribed names.
	Names int `json:"names"`
	// SettledIn is how long, once the changes stopped, every client took
	// to hold the last versions: the bound if some never did.
	SettledIn time.Duration `json:"settled_in_ns"`
	// Behind counts the clients that, at the end, did not hold the last
	// version of some name they subscribe to, and BehindNames those names;
	// FirstBehind tells of one.
	Behind      int    `json:"behind"`
	BehindNames int    `json:"behind_names"`
	FirstBehind string `json:"first_behind,omitempty"`
	// Removals counts the times a client was told that a name it
	// subscribes to was removed (a delta removal, NOT_FOUND, or missing
	// from a SotW Listener or Cluster response): spurious, since the
	// control plane serves every name all along. FirstRemoval tells of one.
	Removals     int64  `json:"removals"`
	FirstRemoval string `json:"first_removal,omitempty"`
	// WentBack counts copies older than the one the client held: a
	// client that moved to a relay behind the one it left.
	WentBack int64 `json:"went_back"`
	// Late counts the names first asked for during a silence (a soak with
	// faults; see lateAsker), LateHeld those that arrived, and
	// LateUnavailable the UNAVAILABLE resource errors told of them
	// meanwhile. Their removals count in Removals.
	Late            int   `json:"late,omitempty"`
	LateHeld        int   `json:"late_held,omitempty"`
	LateUnavailable int64 `json:"late_unavailable,omitempty"`
}

// ok reports whether every client ended at the last versions, and with
// every name asked during a silence, told of no removal.
func (e *Ending) ok() bool { return e.Behind == 0 && e.Removals == 0 && e.LateHeld == e.Late }

// failures says what was wrong with the ending.
func (e *Ending) failures() []string {
	var out []string
	if e.Behind > 0 {
		out = append(out, fmt.Sprintf("%d clients (%d of %d names) did not hold the control plane's last version %s after the changes stopped (%s)",
			e.Behind, e.BehindNames, e.Names, e.SettledIn.Round(time.Millisecond), e.FirstBehind))
	}
	if e.Removals > 0 {
		out = append(out, fmt.Sprintf("%d spurious removals (%s)", e.Removals, e.FirstRemoval))
	}
	if e.LateHeld < e.Late {
		out = append(out, fmt.Sprintf("%d of %d names first asked during a silence never arrived", e.Late-e.LateHeld, e.Late))
	}
	return out
}

// endPoll is how often endCheck looks at what the clients hold.
const endPoll = 100 * time.Millisecond

// endCheck waits, bound at most, for every client to hold the control
// plane's last version of each name it subscribes to (the changes have
// stopped), and late (nil: none) every name it asked, and reads what they
// hold and were told.
func endCheck(ctx context.Context, st *soakTracker, late *lateAsker, bound time.Duration) Ending {
	start := time.Now()
	e := Ending{Names: st.clients * st.width}
	for {
		e.Behind, e.BehindNames, e.FirstBehind = st.behind()
		if (e.Behind == 0 && late.allHeld()) || time.Since(start) >= bound || pause(ctx, endPoll) != nil {
			break
		}
	}
	e.SettledIn = time.Since(start)
	e.Removals, e.FirstRemoval, e.WentBack = st.removals.Load(), st.firstRemoval(), st.wentBack.Load()
	late.end(&e)
	return e
}

// write prints the ending in a few lines.
func (e *Ending) write(w io.Writer, clients int) {
	fmt.Fprintf(w, "at the control plane's last version: %d/%d clients, %d/%d subscribed names, %s after the changes stopped\n",
		clients-e.Behind, clients, e.Names-e.BehindNames, e.Names, e.SettledIn.Round(time.Millisecond))
	if e.FirstBehind != "" {
		fmt.Fprintf(w, "behind: %s\n", e.FirstBehind)
	}
	if e.Late > 0 {
		fmt.Fprintf(w, "names first asked during a silence: %d, received after it: %d, UNAVAILABLE told meanwhile: %d times\n", e.Late, e.LateHeld, e.LateUnavailable)
	}
	fmt.Fprintf(w, "spurious removals: %d\n", e.Removals)
	if e.FirstRemoval != "" {
		fmt.Fprintf(w, "first removal: %s\n", e.FirstRemoval)
	}
	fmt.Fprintf(w, "copies older than one held before: %d\n", e.WentBack)
}
