// Package publish is the InventoryApplier: it keeps this host's
// NodeInventory in Kubernetes current by server-side apply, stamping
// publishedAt on every publish so that readers can tell a live host from a
// dead one (docs/architecture.md, "Freshness contract"). It only ever
// applies: it never deletes an inventory, and on shutdown it writes nothing.
package publish

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/skiff-dev/skiff/api/v1beta1"
	"github.com/skiff-dev/skiff/shared/serverclock"
)

// Source is the host's inventory as of now, without publishedAt; it fails
// while it cannot vouch for the host (shared/hostinventory's Host is one).
type Source interface {
	Inventory() (*v1beta1.NodeInventory, error)
}

// Writer applies an inventory (KubeWriter does it by server-side apply).
type Writer interface {
	Apply(ctx context.Context, inv *v1beta1.NodeInventory) error
}

// InventoryApplier publishes one host's NodeInventory: every
// Options.Interval with publishedAt = now even when nothing changed, and
// soon after a change (at most one write per Options.MinInterval). It
// writes only when the spec differs from the last write or the stamp is
// due, and never while the source is out of sync, so the stamp of a host
// whose sandboxd is unreachable ages and readers drop the node.
type InventoryApplier struct {
	src     Source
	w       Writer
	changes <-chan struct{}
	node    string
	opts    Options
	log     *slog.Logger
	metrics *Metrics
	now     func() time.Time
	clock   *serverclock.Clock
	learn   func(context.Context) error
	learnt  bool // learn was called

	last     *v1beta1.NodeInventorySpec // the spec last written
	unsynced bool                       // the last attempt found the source out of sync
}

// Config wires an InventoryApplier.
type Config struct {
	// Source and Writer are where the inventory comes from and goes.
	Source Source
	Writer Writer
	// Changes receives after the source changed.
	Changes <-chan struct{}
	// NodeName is the inventory's name; a source that names itself
	// otherwise is an error (vk-sandbox would publish another host).
	NodeName string
	Options  Options
	Log      *slog.Logger
	// Metrics may be nil.
	Metrics *Metrics
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// ServerClock, when not nil, corrects publishedAt to the
	// kube-apiserver's time; it should measure against Now. The
	// publishes' schedule keeps Now.
	ServerClock *serverclock.Clock
	// LearnServerTime, when not nil, asks the kube-apiserver anything
	// through the transport ServerClock observes (GET /version), so that
	// a publish while the clock has learnt nothing yet stamps the
	// kube-apiserver's time from its first write. Without it, the first
	// write of a host whose clock is off carries the host's time, and the
	// same publish stamps again once the write's answer told the clock.
	LearnServerTime func(context.Context) error
}

// learnTimeout bounds LearnServerTime: a kube-apiserver that does not
// answer fails the write after it anyway.
const learnTimeout = 5 * time.Second

// New returns an applier; Run runs it.
func New(c Config) *InventoryApplier {
	a := &InventoryApplier{
		src: c.Source, w: c.Writer, changes: c.Changes, node: c.NodeName, opts: c.Options,
		log: c.Log, metrics: c.Metrics, now: c.Now, clock: c.ServerClock, learn: c.LearnServerTime,
	}
	if a.log == nil {
		a.log = slog.Default()
	}
	if a.now == nil {
		a.now = time.Now
	}
	// Until the first sync, being out of sync is no news.
	a.unsynced = true
	return a
}

// ErrWrongHost is returned by Run when sandboxd names itself other than
// the node this vk-sandbox registers.
var ErrWrongHost = errors.New("sandboxd names another node")

// Run publishes until ctx ends, then returns without a final write (a
// restart within the readers' window changes nothing they can see). It
// returns ctx's error, or ErrWrongHost.
func (a *InventoryApplier) Run(ctx context.Context) error {
	s := newSchedule(a.opts)
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-a.changes:
			s.changed()
		case <-timer.C:
			now := a.now()
			if now.Before(s.next()) {
				break // woken early by a reset that raced
			}
			o, err := a.publish(ctx, s, now)
			if errors.Is(err, ErrWrongHost) {
				return err
			}
			s.done(now, o)
		}
		timer.Reset(max(0, s.next().Sub(a.now())))
	}
}

// write writes inv: publishedAt alone when the spec is the one written
// last and the writer can (a Stamper), else the whole inventory, which is
// also what a stamp the stored object has moved on from falls back to.
func (a *InventoryApplier) write(ctx context.Context, inv *v1beta1.NodeInventory, changed bool) error {
	if st, ok := a.w.(Stamper); ok && !changed {
		err := st.Stamp(ctx, inv)
		if err == nil || ctx.Err() != nil {
			return err
		}
		if !errors.Is(err, ErrStale) {
			a.log.Warn("stamp the inventory; applying it whole", "error", err)
		} else if !errors.Is(err, errNeverWritten) {
			a.log.Info("the stored inventory changed since this host wrote it; applying it whole", "error", err)
		}
	}
	return a.w.Apply(ctx, inv)
}

// publish makes one attempt at now.
func (a *InventoryApplier) publish(ctx context.Context, s *schedule, now time.Time) (outcome, error) {
	inv, err := a.src.Inventory()
	if err != nil {
		if !a.unsynced {
			a.log.Warn("not publishing the inventory while sandboxd is out of sync: its stamp ages", "error", err)
		}
		a.unsynced = true
		a.metrics.attempt(notSynced, 0)
		return notSynced, nil
	}
	if a.unsynced {
		a.log.Info("sandboxd is in sync: publishing the inventory")
		a.unsynced = false
	}
	if inv.Name != a.node {
		err := fmt.Errorf("%w: sandboxd's --node-name is %q, this vk-sandbox's is %q", ErrWrongHost, inv.Name, a.node)
		a.log.Error("not publishing the inventory", "error", err)
		return failed, err
	}
	changed := a.last == nil || !equality.Semantic.DeepEqual(*a.last, inv.Spec)
	if !s.shouldWrite(now, changed) {
		a.metrics.attempt(unchanged, 0)
		return unchanged, nil
	}
	if a.clock != nil && a.learn != nil && !a.learnt && !a.clock.Anchored() {
		// Once: an answer without the kube-apiserver's Audit-Id (a proxy
		// that strips it) would never anchor the clock.
		a.learnt = true
		lctx, cancel := context.WithTimeout(ctx, learnTimeout)
		if err := a.learn(lctx); err != nil {
			a.log.Debug("ask the kube-apiserver its time before the first stamp", "error", err)
		}
		cancel()
	}
	stamp := metav1.NewTime(now)
	var corrections uint64
	if a.clock != nil {
		corrections = a.clock.Corrections()
		stamp = metav1.NewTime(a.clock.Now())
	}
	inv.PublishedAt = &stamp
	start := time.Now()
	err = a.write(ctx, inv, changed)
	if err == nil {
		spec := inv.Spec
		a.last = &spec
		if a.clock != nil && a.clock.Corrections() != corrections {
			// The write's own answer moved the clock (the first one
			// of a host whose clock is off): stamp again, unless by no
			// more than the tolerance, rather than leave a stamp
			// readers may take for a dead host's until the next
			// interval.
			if again := a.clock.Now(); again.Sub(stamp.Time).Abs() > serverclock.Tolerance {
				stamp = metav1.NewTime(again)
				inv.PublishedAt = &stamp
				err = a.write(ctx, inv, false)
			}
		}
	}
	if err != nil {
		if ctx.Err() != nil {
			return failed, nil
		}
		a.log.Error("publish the inventory", "error", err)
		a.metrics.attempt(failed, time.Since(start))
		return failed, nil
	}
	a.metrics.attempt(written, time.Since(start))
	a.metrics.published(stamp.Time, len(inv.Spec.Sandboxes))
	if changed {
		a.log.Info("published the inventory", "node", inv.Name, "sandboxes", len(inv.Spec.Sandboxes), "changed", true)
	} else {
		a.log.Debug("published the inventory", "node", inv.Name, "sandboxes", len(inv.Spec.Sandboxes), "changed", false)
	}
	return written, nil
}
