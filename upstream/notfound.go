package upstream

import (
	"time"

	"github.com/xdsrelay/xdsrelay/cache"
)

// asked is names subscribed together on the stream, not yet answered.
type asked struct {
	typeURL  string
	names    []string
	deadline time.Time
}

// notFound is the stream's does-not-exist timer ("Knowing When a Requested
// Resource Does Not Exist"): a name subscribed on the stream that upstream
// has neither sent nor removed within the timeout is taken not to exist,
// as gRPC (A57) and Envoy (initial_fetch_timeout) do. Should it arrive
// later, it is applied like any update. Owned by the session loop.
type notFound struct {
	timeout time.Duration // 0: disabled
	queue   []asked       // by deadline: every batch gets the same timeout
	timer   *time.Timer   // armed for queue[0]; nil when the queue is empty
}

// asked starts the timer of names just subscribed.
func (n *notFound) asked(typeURL string, names []string) {
	if n.timeout <= 0 || len(names) == 0 {
		return
	}
	n.queue = append(n.queue, asked{typeURL: typeURL, names: names, deadline: time.Now().Add(n.timeout)})
	n.arm()
}

func (n *notFound) arm() {
	if len(n.queue) == 0 || n.timer != nil {
		return
	}
	n.timer = time.NewTimer(time.Until(n.queue[0].deadline))
}

// C fires when the earliest deadline passes; nil (never) with none pending.
func (n *notFound) C() <-chan time.Time {
	if n.timer == nil {
		return nil
	}
	return n.timer.C
}

// stop releases the timer when the stream ends: a new stream asks again.
func (n *notFound) stop() {
	if n.timer != nil {
		n.timer.Stop()
		n.timer = nil
	}
	n.queue = nil
}

// expired takes the names whose deadline has passed, by type.
func (n *notFound) expired(now time.Time) map[string][]string {
	n.timer = nil
	out := make(map[string][]string)
	i := 0
	for ; i < len(n.queue) && !n.queue[i].deadline.After(now); i++ {
		a := n.queue[i]
		out[a.typeURL] = append(out[a.typeURL], a.names...)
	}
	clear(n.queue[:i]) // let the names go
	n.queue = n.queue[i:]
	n.arm()
	return out
}

// timedOut applies, for each type, the names still subscribed that upstream
// has not answered as not existing; it returns how many there were.
func (s *session) timedOut(now time.Time) int {
	count := 0
	for typeURL, names := range s.notFound.expired(now) {
		sub := s.subs[typeURL]
		if sub == nil {
			continue
		}
		var missing []string
		for i, l := range s.c.opts.Cache.Get(typeURL, names) {
			_, subscribed := sub.names[names[i]]
			if subscribed && l.Resource == nil && !l.Absent {
				missing = append(missing, names[i])
			}
		}
		if len(missing) > 0 {
			s.c.opts.Cache.Apply(typeURL, cache.Change{Removed: missing})
			s.c.log.Info("no answer from the control plane within cache.not_found_timeout; reported as not existing",
				"type", typeURL, "names", len(missing), "first", missing[0])
			count += len(missing)
		}
	}
	return count
}
