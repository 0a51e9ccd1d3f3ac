package registry

import (
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	metainternalversion "k8s.io/apimachinery/pkg/apis/meta/internalversion"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	sbv1 "github.com/skiff-dev/skiff/api/sandbox/v1beta1"
	"github.com/skiff-dev/skiff/api/v1beta1"
	"github.com/skiff-dev/skiff/apiserver/internal/aggregated/view"
	"github.com/skiff-dev/skiff/shared/inventory"
	"github.com/skiff-dev/skiff/shared/sandboxid"
)

// fleet20x2000 is 20 inventories of 2,000 sandboxes each, over 50 teams,
// with e2b metadata, as the list benchmarks of the e2b API use.
func fleet20x2000(b *testing.B) (*inventory.StaticSource, []*v1beta1.NodeInventory) {
	b.Helper()
	src := inventory.NewStaticSource()
	now := v1beta1.NewMicroTime(time.Now())
	end := v1beta1.NewMicroTime(now.Add(time.Hour))
	var nodes []*v1beta1.NodeInventory
	for n := range 20 {
		name := fmt.Sprintf("host-%02d", n)
		inv := &v1beta1.NodeInventory{ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: strconv.Itoa(1000 + n)}}
		for i := range 2000 {
			id, err := sandboxid.New(sandboxid.NodeTag(name))
			if err != nil {
				b.Fatal(err)
			}
			inv.Spec.Sandboxes = append(inv.Spec.Sandboxes, v1beta1.SandboxEntry{
				ID: id, Template: "base", State: v1beta1.SandboxRunning, Team: fmt.Sprintf("team-%02d", i%50),
				StartedAt: now, EndAt: &end, CPUMilli: 1000, MemoryMiB: 512,
				Metadata: map[string]string{"user": fmt.Sprintf("user-%d", i%50), "purpose": "bench"},
			})
		}
		src.Apply(inv)
		nodes = append(nodes, inv)
	}
	return src, nodes
}

// BenchmarkList times the aggregated API's list over 20 nodes × 2,000
// sandboxes inside the server (the storage, before serialisation): all of
// it at once, the first page of 500, and the whole list in pages of 500
// as kubectl's --chunk-size 500 (its default) fetches it.
func BenchmarkList(b *testing.B) {
	src, _ := fleet20x2000(b)
	s, _, _ := newStorage(b, src)
	b.Run("all-40000", func(b *testing.B) {
		for b.Loop() {
			if l, err := s.List(b.Context(), nil); err != nil || len(l.(*sbv1.SandboxList).Items) != 40000 {
				b.Fatal(err)
			}
		}
	})
	b.Run("page-500", func(b *testing.B) {
		for b.Loop() {
			if l, err := s.List(b.Context(), &metainternalversion.ListOptions{Limit: 500}); err != nil || len(l.(*sbv1.SandboxList).Items) != 500 {
				b.Fatal(err)
			}
		}
	})
	b.Run("chunked-500", func(b *testing.B) {
		for b.Loop() {
			n, cont := 0, ""
			for {
				l, err := s.List(b.Context(), &metainternalversion.ListOptions{Limit: 500, Continue: cont})
				if err != nil {
					b.Fatal(err)
				}
				sl := l.(*sbv1.SandboxList)
				n += len(sl.Items)
				if cont = sl.Continue; cont == "" {
					break
				}
			}
			if n != 40000 {
				b.Fatalf("%d items", n)
			}
		}
	})
}

// BenchmarkRebuild times one rebuild of the view after one node's
// inventory changed (one sandbox paused or resumed), in a fleet of 20 ×
// 2,000: what every inventory event costs.
func BenchmarkRebuild(b *testing.B) {
	src, nodes := fleet20x2000(b)
	v := view.New(src, view.Options{})
	if err := v.Rebuild(b.Context()); err != nil {
		b.Fatal(err)
	}
	rv := 5000
	for b.Loop() {
		flip(src, nodes[rv%20], &rv)
		if err := v.Rebuild(b.Context()); err != nil {
			b.Fatal(err)
		}
	}
}

// flip pauses (or resumes) the first sandbox of inv and publishes it at the
// next resourceVersion.
func flip(src *inventory.StaticSource, inv *v1beta1.NodeInventory, rv *int) {
	*rv++
	e := &inv.Spec.Sandboxes[0]
	if e.State == v1beta1.SandboxRunning {
		e.State = v1beta1.SandboxPaused
	} else {
		e.State = v1beta1.SandboxRunning
	}
	inv.ResourceVersion = strconv.Itoa(*rv)
	src.Apply(inv)
}

// BenchmarkWatchers50 times one inventory change in a 20 × 2,000 fleet
// until each of 50 watchers (across namespaces, as an informer watches)
// has its MODIFIED event: the rebuild plus the fan-out.
func BenchmarkWatchers50(b *testing.B) {
	src, nodes := fleet20x2000(b)
	v := view.New(src, view.Options{})
	if err := v.Rebuild(b.Context()); err != nil {
		b.Fatal(err)
	}
	var ws []watch.Interface
	for range 50 {
		w, err := v.Watch(b.Context(), view.WatchOptions{ResourceVersion: v.Current().RV})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(w.Stop)
		ws = append(ws, w)
	}
	rv := 5000
	for b.Loop() {
		flip(src, nodes[rv%20], &rv)
		if err := v.Rebuild(b.Context()); err != nil {
			b.Fatal(err)
		}
		var wg sync.WaitGroup
		for _, w := range ws {
			wg.Go(func() {
				if e := <-w.ResultChan(); e.Type != watch.Modified {
					b.Errorf("event %s", e.Type)
				}
			})
		}
		wg.Wait()
	}
}
