package fleetsource

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apimachinery/pkg/watch"
	toolscache "k8s.io/client-go/tools/cache"
	crlog "sigs.k8s.io/controller-runtime/pkg/log"
)

// Retries of a list or watch that the kube-apiserver failed while out of
// reach or starting.
//
// client-go's reflector backs off exponentially after each failed list or
// watch, to 30 s and then up to 60 s with its jitter, and forgets the
// backoff only after two minutes without a failure. A cache that lived
// through an outage of the kube-apiserver (a restart, an upgrade that
// restarts it twice) may therefore wait up to a minute after the
// kube-apiserver is back, or longer when its first attempt meets the
// restarted server's authorizer before its RBAC is loaded, before it
// watches again; and meanwhile the fleet it serves is the one from before
// the outage: the warm-pool driver counts sandboxes claimed during it as
// still warm, and the freshness reference does not move. The backoff
// cannot be set through a shared informer (client-go's
// ReflectorOptions.Backoff is not exposed there), so the informers of
// OpenKube list and watch through a ListerWatcher that retries those
// failures itself, at most RetryMax apart, and hands the reflector only
// the others (a resource version too old, a bad request), which it
// handles at once by listing again.
const (
	RetryMin = 250 * time.Millisecond
	RetryMax = 4 * time.Second
	// retryLogEvery is how often a failure that lasts is logged again.
	retryLogEvery = 30 * time.Second
)

// retrying returns the informer constructor of OpenKube: client-go's,
// over a ListerWatcher that retries transient failures (see RetryMax).
func retrying(log logr.Logger) func(toolscache.ListerWatcher, runtime.Object, time.Duration, toolscache.Indexers) toolscache.SharedIndexInformer {
	return func(lw toolscache.ListerWatcher, obj runtime.Object, resync time.Duration, idx toolscache.Indexers) toolscache.SharedIndexInformer {
		kind := strings.TrimPrefix(fmt.Sprintf("%T", obj), "*")
		r := &retryLW{lw: toolscache.ToListerWatcherWithContext(lw), kind: kind, log: log}
		return toolscache.NewSharedIndexInformer(r, obj, resync, idx)
	}
}

// retryLW is a ListerWatcher that retries transient failures itself.
type retryLW struct {
	lw   toolscache.ListerWatcherWithContext
	kind string
	log  logr.Logger

	mu sync.Mutex
	// since is when the current run of failures began, zero if none.
	since    time.Time
	failures int
	logged   time.Time
}

var _ toolscache.ListerWatcherWithContext = (*retryLW)(nil)

func (r *retryLW) List(o metav1.ListOptions) (runtime.Object, error) {
	return r.ListWithContext(context.Background(), o)
}

func (r *retryLW) Watch(o metav1.ListOptions) (watch.Interface, error) {
	return r.WatchWithContext(context.Background(), o)
}

func (r *retryLW) ListWithContext(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
	return retry(ctx, r, "list", func() (runtime.Object, error) { return r.lw.ListWithContext(ctx, o) })
}

func (r *retryLW) WatchWithContext(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
	return retry(ctx, r, "watch", func() (watch.Interface, error) { return r.lw.WatchWithContext(ctx, o) })
}

// retry calls f until it succeeds, fails otherwise than transiently, or
// ctx ends, waiting RetryMin, doubling to RetryMax, between calls.
func retry[T any](ctx context.Context, r *retryLW, verb string, f func() (T, error)) (T, error) {
	wait := RetryMin
	for {
		v, err := f()
		if err == nil || !transient(err) {
			r.ended(verb, err == nil)
			return v, err
		}
		if ctx.Err() != nil {
			// The informer stops: its connection's end is no failure of
			// the kube-apiserver's.
			return v, err
		}
		r.failed(verb, err)
		if d, ok := apierrors.SuggestsClientDelay(err); ok {
			wait = max(wait, min(time.Duration(d)*time.Second, RetryMax))
		}
		select {
		case <-ctx.Done():
			return v, err
		case <-time.After(wait):
		}
		wait = min(2*wait, RetryMax)
	}
}

// transient reports whether err is one of a kube-apiserver out of reach
// or not yet serving: refused or reset connections, timeouts, 429 and
// 503, and 401 and 403, which a restarted kube-apiserver answers until its
// authenticators and RBAC are loaded (and a misconfigured one answers on:
// it is logged, every retryLogEvery, as client-go's reflector would).
func transient(err error) bool {
	var ne net.Error
	switch {
	case utilnet.IsConnectionRefused(err), utilnet.IsConnectionReset(err), utilnet.IsProbableEOF(err):
		return true
	case errors.As(err, &ne) && ne.Timeout():
		return true
	}
	return apierrors.IsTooManyRequests(err) || apierrors.IsServiceUnavailable(err) || apierrors.IsServerTimeout(err) ||
		apierrors.IsTimeout(err) || apierrors.IsUnauthorized(err) || apierrors.IsForbidden(err)
}

// failed records a transient failure, and logs the first of a run and
// then one every retryLogEvery.
func (r *retryLW) failed(verb string, err error) {
	r.mu.Lock()
	now := time.Now()
	if r.since.IsZero() {
		r.since = now
	}
	r.failures++
	first, since, n := r.failures == 1, r.since, r.failures
	logNow := first || now.Sub(r.logged) >= retryLogEvery
	if logNow {
		r.logged = now
	}
	r.mu.Unlock()
	switch {
	case first:
		r.log.Info("the kube-apiserver failed a "+verb+"; retrying at most "+RetryMax.String()+" apart", "kind", r.kind, "error", err.Error())
	case logNow:
		r.log.Error(err, "the kube-apiserver still fails the "+verb+"s; retrying", "kind", r.kind, "for", now.Sub(since).Round(time.Second).String(), "attempts", n)
	}
}

// ended ends a run of failures on a success (or on an error not retried),
// and logs how long it lasted.
func (r *retryLW) ended(verb string, ok bool) {
	r.mu.Lock()
	since, n := r.since, r.failures
	r.since, r.failures, r.logged = time.Time{}, 0, time.Time{}
	now := time.Now()
	r.mu.Unlock()
	if n > 0 && ok {
		r.log.Info("the kube-apiserver serves the "+verb+" again", "kind", r.kind, "after", now.Sub(since).Round(100*time.Millisecond).String(), "attempts", n+1)
	}
}

// retryLog is the retries' logger: controller-runtime's, which
// SendCacheLogs sets.
func retryLog() logr.Logger { return crlog.Log.WithName("informer-retry") }
