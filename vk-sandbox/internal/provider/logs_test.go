package provider

import (
	"bufio"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/virtual-kubelet/virtual-kubelet/node/api"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
)

// A followed log gives every line, in order, once, however many come
// between two of its reads and however many share a time (envd stamps a
// write's lines alike): a burst of more than a read is read in pages from
// a cursor (the last line's time, and how many of that time were shown),
// not as the newest page (which skipped the rest). With --tail, the lines
// before the tail stay unshown; the rest of a write the first read saw in
// part is shown. Against a sandboxd that ignores skip too.
func TestFollowKeepsEveryLine(t *testing.T) {
	for _, old := range []bool{false, true} {
		t.Run(fmt.Sprintf("sandboxd-ignores-skip=%v", old), func(t *testing.T) { followKeepsEveryLine(t, old) })
	}
}

func followKeepsEveryLine(t *testing.T, old bool) {
	f := newFixture(t)
	f.h.noSkip = old
	pod := f.add(t, "a", nil)
	if err := f.p.CreatePod(t.Context(), pod); err != nil {
		t.Fatal(err)
	}
	line := func(i int, at time.Duration) *pb.LogEntry {
		return &pb.LogEntry{Timestamp: timestamppb.New(t0.Add(at)), Line: fmt.Sprint("line ", i), Source: "stdout"}
	}
	// Five lines of one write, then the first three of another, of which
	// --tail 5 shows lines 3 to 7.
	f.h.set(func(h *host) {
		for i := range 8 {
			h.logs = append(h.logs, line(i, time.Duration(1+i/5)*time.Millisecond))
		}
	})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	r, err := f.p.GetContainerLogs(ctx, pod.Namespace, pod.Name, "sandbox", api.ContainerLogOpts{Follow: true, Tail: 5})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	sc := bufio.NewScanner(r)
	next := func(want int) {
		t.Helper()
		if !sc.Scan() {
			t.Fatalf("the log ended before line %d: %v", want, sc.Err())
		}
		if w := fmt.Sprint("line ", want); sc.Text() != w {
			t.Fatalf("got %q, want %q", sc.Text(), w)
		}
	}
	for i := 3; i < 8; i++ {
		next(i)
	}
	// The rest of that write; then more than a read's lines of one write
	// (a sandboxd that ignores skip cannot page past a read's lines of one
	// time: fewer), and more than a read's of writes a millisecond apart.
	group, more := maxLogLines+10, maxLogLines+500
	if old {
		group = 500
	}
	f.h.set(func(h *host) {
		for i := 8; i < 10; i++ {
			h.logs = append(h.logs, line(i, 2*time.Millisecond))
		}
		for j := range group {
			h.logs = append(h.logs, line(10+j, 3*time.Millisecond))
		}
		for j := range more {
			h.logs = append(h.logs, line(10+group+j, time.Duration(4+j)*time.Millisecond))
		}
	})
	for i := 8; i < 10+group+more; i++ {
		next(i)
	}
}

// A follow whose first read holds the whole log, all of one time (a new
// sandbox's first write, read half way), shows the rest of that write.
func TestFollowKeepsTheRestOfAWrite(t *testing.T) {
	f := newFixture(t)
	pod := f.add(t, "a", nil)
	if err := f.p.CreatePod(t.Context(), pod); err != nil {
		t.Fatal(err)
	}
	line := func(i int) *pb.LogEntry {
		return &pb.LogEntry{Timestamp: timestamppb.New(t0.Add(time.Millisecond)), Line: fmt.Sprint("line ", i), Source: "stdout"}
	}
	f.h.set(func(h *host) {
		for i := range 5 {
			h.logs = append(h.logs, line(i))
		}
	})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	r, err := f.p.GetContainerLogs(ctx, pod.Namespace, pod.Name, "sandbox", api.ContainerLogOpts{Follow: true})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	sc := bufio.NewScanner(r)
	for i := range 8 {
		if !sc.Scan() {
			t.Fatalf("the log ended before line %d: %v", i, sc.Err())
		}
		if want := fmt.Sprint("line ", i); sc.Text() != want {
			t.Fatalf("got %q, want %q", sc.Text(), want)
		}
		if i == 4 {
			f.h.set(func(h *host) {
				for j := 5; j < 8; j++ {
					h.logs = append(h.logs, line(j))
				}
			})
		}
	}
}
