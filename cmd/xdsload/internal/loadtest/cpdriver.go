package loadtest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/xdsrelay/xdsrelay/internal/faultproxy"
)

// cpDriver changes a resource every cfg.UpdateEvery and, in a soak, every
// cfg.Soak.RestartEvery injects the next fault between the relay and its
// control plane: a restart of the control plane, and with cfg.Soak.Faults
// in turn silence, a trickle and a reset of the connections too. The
// changes go on through a fault; what the clients receive of them until
// the relay is back is left out of the fan-out.
type cpDriver struct {
	// Read-only after newCPDriver.
	cfg    *Config
	pub    publisher
	b      soakBackend // injects faults and samples the relay; nil: changes alone
	st     *soakTracker
	count  bool        // receipts count in the fan-out (a soak's rows)
	faults []faultKind // injected in turn
	late   *lateAsker  // asks for a late name at each silence; nil: none

	// calm is held from a fault's start until the relay is back on its
	// control plane, and through a row's sample: a row is not taken
	// mid-fault.
	calm sync.Mutex
	// quiet is held through a change's publication and through a row's
	// sample, which waits for the last change to have settled.
	quiet sync.Mutex
	last  time.Time // the last change published; guarded by quiet

	// Owned by run's goroutine; log is read once it has returned.
	start  time.Time    // of the run
	seq    int          // the last change published
	fault  *activeFault // nil: none on
	nFault int          // faults started
	log    []SoakFault  // the faults over
}

// publisher publishes change seq and tells when it handed it over.
type publisher interface {
	publish(seq int) (time.Time, error)
}

func newCPDriver(cfg *Config, pub publisher, b soakBackend, st *soakTracker, late *lateAsker) *cpDriver {
	d := &cpDriver{cfg: cfg, pub: pub, b: b, st: st, late: late, count: b != nil, faults: []faultKind{faultRestart}}
	if cfg.Soak.Faults {
		d.faults = []faultKind{faultRestart, faultSilence, faultTrickle, faultReset}
	}
	return d
}

// faultKind is a fault a soak injects between the relay and its control
// plane.
type faultKind int

const (
	faultRestart faultKind = iota // the control plane stops serving, and comes back
	faultSilence                  // the link carries nothing, connections stay open
	faultTrickle                  // the link carries soakTrickleRate bytes a second
	faultReset                    // every connection on the link is reset
	nFaultKinds
)

var faultNames = [nFaultKinds]string{"control-plane restart", "silence", "trickle", "reset"}

// SoakFault is one fault a soak injected, and how the relay came through.
type SoakFault struct {
	Kind string        `json:"kind"`
	At   time.Duration `json:"at_ns"`  // into the soak
	For  time.Duration `json:"for_ns"` // how long it lasted
	// Detected is from its start to the relay having fewer groups with
	// their upstream stream up; 0 if it never had.
	Detected time.Duration `json:"detected_ns"`
	// Back is from its end to the relay's upstream streams all up again
	// and every client holding every change published meanwhile.
	Back time.Duration `json:"back_ns"`
}

// activeFault is the fault on, and how the relay comes through it.
type activeFault struct {
	SoakFault
	kind    faultKind
	started time.Time
	up      int         // the relay's groups with their upstream up, before it
	heal    *time.Timer // when the fault ends; nil once it has
	healed  time.Time
	// poll looks, while the fault is on, whether the relay found it, and
	// once it is over whether the relay is back, until deadline.
	poll     *time.Ticker
	deadline time.Time
}

func (f *activeFault) healC() <-chan time.Time {
	if f == nil || f.heal == nil {
		return nil
	}
	return f.heal.C
}

func (f *activeFault) pollC() <-chan time.Time {
	if f == nil || f.poll == nil {
		return nil
	}
	return f.poll.C
}

func (f *activeFault) stop() {
	if f.heal != nil {
		f.heal.Stop()
	}
	if f.poll != nil {
		f.poll.Stop()
	}
}

// settle is how long a change takes to settle, as a sample or a fault
// waits for it: half the interval between changes, settleMax at most.
func (d *cpDriver) settle() time.Duration { return min(d.cfg.UpdateEvery/2, settleMax) }

const settleMax = 2 * time.Second

// settled runs f once the last change has settled, changes held meanwhile.
func (d *cpDriver) settled(ctx context.Context, f func() error) error {
	d.quiet.Lock()
	defer d.quiet.Unlock()
	if err := pause(ctx, time.Until(d.last.Add(d.settle()))); err != nil {
		return err
	}
	return f()
}

// sample samples the relay once no fault is on and the last change has
// settled, changes and faults held meanwhile.
func (d *cpDriver) sample(ctx context.Context) (*RelaySample, error) {
	d.calm.Lock()
	defer d.calm.Unlock()
	var s *RelaySample
	err := d.settled(ctx, func() (err error) {
		s, err = d.b.relaySample()
		return err
	})
	return s, err
}

// run drives the control plane until ctx ends, and ends a fault still on.
func (d *cpDriver) run(ctx context.Context) (err error) {
	change := time.NewTicker(d.cfg.UpdateEvery)
	defer change.Stop()
	var faultTick <-chan time.Time
	if d.b != nil {
		t := time.NewTicker(d.cfg.Soak.RestartEvery)
		defer t.Stop()
		faultTick = t.C
	}
	d.start = time.Now()
	defer func() { err = errors.Join(err, d.endFault()) }()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-change.C:
			err = d.change()
		case <-faultTick:
			if d.fault == nil {
				err = d.startFault(ctx)
			}
		case <-d.fault.healC():
			err = d.heal()
		case <-d.fault.pollC():
			err = d.look()
		}
		if err != nil {
			return err
		}
	}
}

// change publishes the next change; its receipts count in the fan-out
// unless a fault is on.
func (d *cpDriver) change() error {
	d.quiet.Lock()
	defer d.quiet.Unlock()
	d.seq++
	d.st.announce(d.seq)
	t, err := d.pub.publish(d.seq)
	if err != nil {
		return fmt.Errorf("change %d: %w", d.seq, err)
	}
	d.st.published(d.seq, t, d.count && d.fault == nil)
	d.last = time.Now()
	return nil
}

// startFault injects the next fault once the last change has settled, so
// that its fan-out is not held up by the fault. Rows wait until the relay
// is back.
func (d *cpDriver) startFault(ctx context.Context) error {
	d.calm.Lock()
	if ctx.Err() != nil { // the soak ended while a row was sampled
		d.calm.Unlock()
		return nil
	}
	kind := d.faults[d.nFault%len(d.faults)]
	var up int
	err := d.settled(ctx, func() (err error) {
		up, err = d.b.upstreamConnected()
		return err
	})
	if err == nil {
		err = d.inject(kind)
	}
	if err != nil {
		d.calm.Unlock()
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("soak: %s: %w", faultNames[kind], err)
	}
	d.nFault++
	d.st.faults[kind].Add(1)
	now := time.Now()
	d.fault = &activeFault{kind: kind, up: up, started: now, heal: time.NewTimer(d.lasts(kind)), poll: time.NewTicker(faultPoll),
		SoakFault: SoakFault{Kind: faultNames[kind], At: now.Sub(d.start)}}
	return nil
}

// lasts is how long a fault of kind lasts.
func (d *cpDriver) lasts(kind faultKind) time.Duration {
	switch kind {
	case faultRestart:
		return d.cfg.Soak.Down
	case faultSilence, faultTrickle:
		return d.cfg.Soak.FaultFor
	}
	return 0
}

// inject starts a fault of kind.
func (d *cpDriver) inject(kind faultKind) error {
	switch kind {
	case faultRestart:
		return d.b.pause()
	case faultSilence:
		if err := d.b.link(faultproxy.Silent, 0); err != nil {
			return err
		}
		if d.late != nil {
			d.late.ask()
		}
	case faultTrickle:
		return d.b.link(faultproxy.Trickle, soakTrickleRate)
	case faultReset:
		return d.b.resetLink()
	}
	return nil
}

// clear ends a fault of kind.
func (d *cpDriver) clear(kind faultKind) error {
	switch kind {
	case faultRestart:
		return d.b.resume()
	case faultSilence, faultTrickle:
		return d.b.link(faultproxy.Pass, 0)
	}
	return nil
}

// heal ends the fault on, and looks from now on whether the relay is back.
func (d *cpDriver) heal() error {
	f := d.fault
	f.heal = nil
	if err := d.clear(f.kind); err != nil {
		return fmt.Errorf("soak: ending the %s: %w", faultNames[f.kind], err)
	}
	f.healed = time.Now()
	f.For, f.deadline = f.healed.Sub(f.started), f.healed.Add(reconnectBound)
	return nil
}

// look notes when the relay found the fault on, and once it is over,
// ends it when the relay has as many groups with their upstream stream up
// as before it and every client holds every change.
func (d *cpDriver) look() error {
	f := d.fault
	n, err := d.b.upstreamConnected()
	if err != nil {
		return fmt.Errorf("soak: %w", err)
	}
	if n < f.up && f.Detected == 0 {
		f.Detected = time.Since(f.started)
	}
	switch {
	case f.heal != nil: // on
	case n >= f.up && d.caughtUp():
		f.Back = time.Since(f.healed)
		d.log = append(d.log, f.SoakFault)
		f.stop()
		d.fault = nil
		d.calm.Unlock()
	case time.Now().After(f.deadline):
		return fmt.Errorf("soak: the relay was not back on its control plane, every client holding every change, %s after the %s ended (%d of %d groups up)",
			reconnectBound, faultNames[f.kind], n, f.up)
	}
	return nil
}

// caughtUp reports whether every client holds the last change of every
// name it subscribes to.
func (d *cpDriver) caughtUp() bool {
	behind, _, _ := d.st.behind()
	return behind == 0
}

// endFault ends a fault still on when the driver stops.
func (d *cpDriver) endFault() error {
	f := d.fault
	if f == nil {
		return nil
	}
	f.stop()
	var err error
	if f.heal != nil {
		err = d.clear(f.kind)
	}
	d.fault = nil
	d.calm.Unlock()
	return err
}

// How often the driver looks at the relay through a fault, and how long
// at most it waits for it to be back after: past its 30s reconnect
// backoff, with room.
const (
	faultPoll      = 100 * time.Millisecond
	reconnectBound = 45 * time.Second
)
