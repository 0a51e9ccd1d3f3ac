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
// before the tail stay unshown.
func TestFollowKeepsEveryLine(t *testing.T) {
	f := newFixture(t)
	pod := f.add(t, "a", nil)
	if err := f.p.CreatePod(t.Context(), pod); err != nil {
		t.Fatal(err)
	}
	line := func(i int, at time.Duration) *pb.LogEntry {
		return &pb.LogEntry{Timestamp: timestamppb.New(t0.Add(at)), Line: fmt.Sprint("line ", i), Source: "stdout"}
	}
	// Ten lines of one write, of which --tail 5 shows the last five.
	f.h.set(func(h *host) {
		for i := range 10 {
			h.logs = append(h.logs, line(i, time.Millisecond))
		}
	})
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
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
	for i := 5; i < 10; i++ {
		next(i)
	}
	// Then more than a read's lines of one write, and more than a read's
	// of writes a millisecond apart.
	const group, more = maxLogLines + 10, maxLogLines + 500
	f.h.set(func(h *host) {
		for j := range group {
			h.logs = append(h.logs, line(10+j, 2*time.Millisecond))
		}
		for j := range more {
			h.logs = append(h.logs, line(10+group+j, time.Duration(3+j)*time.Millisecond))
		}
	})
	for i := 10; i < 10+group+more; i++ {
		next(i)
	}
}
