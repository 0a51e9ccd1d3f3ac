package view

import (
	"context"
	"strconv"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/skiff-dev/skiff/api/sandbox/v1beta1"
)

// DefaultBookmarkInterval is how often a watch that allows bookmarks gets
// one when WatchOptions leaves it unset.
const DefaultBookmarkInterval = 30 * time.Second

// WatchOptions say where a watch starts and what it sends.
type WatchOptions struct {
	// ResourceVersion is where the watch starts: the events after it. 0
	// starts from the current snapshot, whose sandboxes are sent first as
	// ADDED (the opening burst).
	ResourceVersion uint64
	// SendInitialEvents sends the current snapshot (once the view has
	// reached ResourceVersion) as ADDED, then a BOOKMARK annotated
	// k8s.io/initial-events-end: a client-go informer's watch-list.
	SendInitialEvents bool
	// Bookmarks sends a BOOKMARK with the watch's resourceVersion every
	// BookmarkInterval.
	Bookmarks        bool
	BookmarkInterval time.Duration
	// Filter selects the sandboxes the watch sends; nil is all.
	Filter func(*v1beta1.Sandbox) bool
}

// Watch starts a watch. The error is a Kubernetes status error: 410 Gone
// (apierrors.IsResourceExpired) for a resourceVersion older than the
// history or inside a batch, a TooLargeResourceVersion one for a version
// the view has not reached within a few seconds.
func (v *View) Watch(ctx context.Context, o WatchOptions) (watch.Interface, error) {
	if rv := o.ResourceVersion; rv != 0 && !o.SendInitialEvents && rv&snapshotSeq != snapshotSeq {
		return nil, insideBatch(rv)
	}
	cur, err := v.WaitFor(ctx, o.ResourceVersion)
	if err != nil {
		return nil, err
	}
	var initial []*v1beta1.Sandbox
	from := o.ResourceVersion
	if from == 0 || o.SendInitialEvents {
		initial, from = cur.items, cur.RV
	} else if _, _, ok := v.since(from); !ok {
		return nil, &apierrors.StatusError{ErrStatus: *expired(from)}
	}
	if o.Filter == nil {
		o.Filter = func(*v1beta1.Sandbox) bool { return true }
	}
	if o.BookmarkInterval <= 0 {
		o.BookmarkInterval = DefaultBookmarkInterval
	}
	w := &watcher{v: v, o: o, result: make(chan watch.Event), done: make(chan struct{})}
	ctx, cancel := context.WithCancel(ctx)
	w.cancel = cancel
	go w.run(ctx, initial, from)
	return w, nil
}

type watcher struct {
	v      *View
	o      WatchOptions
	result chan watch.Event
	done   chan struct{}
	once   sync.Once
	cancel context.CancelFunc
}

func (w *watcher) ResultChan() <-chan watch.Event { return w.result }

func (w *watcher) Stop() {
	w.once.Do(func() {
		close(w.done)
		w.cancel()
	})
}

// InitialEventsEnd is the annotation on the bookmark that ends a watch's
// initial events.
const InitialEventsEnd = metav1.InitialEventsAnnotationKey

func bookmark(rv uint64, end bool) *v1beta1.Sandbox {
	b := &v1beta1.Sandbox{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1beta1.GroupVersion.String(), Kind: "Sandbox"},
		ObjectMeta: metav1.ObjectMeta{ResourceVersion: strconv.FormatUint(rv, 10)},
	}
	if end {
		b.Annotations = map[string]string{InitialEventsEnd: "true"}
	}
	return b
}

func (w *watcher) run(ctx context.Context, initial []*v1beta1.Sandbox, cursor uint64) {
	defer close(w.result)
	send := func(e watch.Event) bool {
		select {
		case w.result <- e:
			return true
		case <-ctx.Done():
			return false
		}
	}
	for _, sb := range initial {
		if w.o.Filter(sb) && !send(watch.Event{Type: watch.Added, Object: sb}) {
			return
		}
	}
	// The bookmark that ends the initial events is a watch-list's
	// (sendInitialEvents with allowWatchBookmarks), as the kube-apiserver's
	// watch cache sends it.
	if w.o.SendInitialEvents && w.o.Bookmarks && !send(watch.Event{Type: watch.Bookmark, Object: bookmark(cursor, true)}) {
		return
	}
	var tick <-chan time.Time
	if w.o.Bookmarks {
		t := time.NewTicker(w.o.BookmarkInterval)
		defer t.Stop()
		tick = t.C
	}
	for {
		events, changed, ok := w.v.since(cursor)
		if !ok {
			send(watch.Event{Type: watch.Error, Object: expired(cursor)})
			return
		}
		var sent uint64
		for _, e := range events {
			cursor = e.rv
			if out, ok := w.event(e); ok {
				if !send(out) {
					return
				}
				sent = e.rv
			}
		}
		// The history holds whole batches: the last event is at its
		// batch's end. A client whose last event was inside a batch
		// could resume only with a 410; a bookmark moves it to the end.
		if sent != 0 && sent != cursor && w.o.Bookmarks && !send(watch.Event{Type: watch.Bookmark, Object: bookmark(cursor, false)}) {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-tick:
			if !send(watch.Event{Type: watch.Bookmark, Object: bookmark(cursor, false)}) {
				return
			}
		}
	}
}

// event is what change e is to this watch, as the kube-apiserver's watch
// cache makes it (k8s.io/apiserver's cacheWatcher.convertToWatchEvent): the
// filter is matched against the sandbox before and after the change, so
// that a sandbox the change takes out of the selection (one paused, to a
// watch of status.state=running) is DELETED, as it was last selected but
// at the change's resourceVersion, and one the change brings in is ADDED;
// matched on the new sandbox alone, a watch with a selector (kubectl get
// -w, an informer) would keep the paused one until it relists. false: the
// watch has no interest in e.
func (w *watcher) event(e Event) (watch.Event, bool) {
	now := e.Type != watch.Deleted && w.o.Filter(e.Object)
	var before bool
	switch e.Type {
	case watch.Deleted:
		before = w.o.Filter(e.Object)
	case watch.Modified:
		before = e.Prev != nil && w.o.Filter(e.Prev)
	}
	switch {
	case now && before:
		return watch.Event{Type: watch.Modified, Object: e.Object}, true
	case now:
		return watch.Event{Type: watch.Added, Object: e.Object}, true
	case before && e.Type == watch.Deleted:
		return watch.Event{Type: watch.Deleted, Object: e.Object}, true
	case before:
		gone := e.Prev.DeepCopy()
		gone.ResourceVersion = e.Object.ResourceVersion
		return watch.Event{Type: watch.Deleted, Object: gone}, true
	}
	return watch.Event{}, false
}
