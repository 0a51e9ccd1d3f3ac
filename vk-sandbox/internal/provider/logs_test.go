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

// A followed log gives every line, in order, however many come between two
// of its reads: a burst of more than a read's lines is read in pages from
// the last line seen, not as the newest page (which skipped the rest).
func TestFollowKeepsEveryLine(t *testing.T) {
	f := newFixture(t)
	pod := f.add(t, "a", nil)
	if err := f.p.CreatePod(t.Context(), pod); err != nil {
		t.Fatal(err)
	}
	line := func(i int) *pb.LogEntry {
		return &pb.LogEntry{Timestamp: timestamppb.New(t0.Add(time.Duration(i) * time.Millisecond)), Line: fmt.Sprint("line ", i), Source: "stdout"}
	}
	const before, burst = 3, 2*maxLogLines + 500
	f.h.set(func(h *host) {
		for i := range before {
			h.logs = append(h.logs, line(i))
		}
	})
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	r, err := f.p.GetContainerLogs(ctx, pod.Namespace, pod.Name, "sandbox", api.ContainerLogOpts{Follow: true})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	sc := bufio.NewScanner(r)
	for i := range before + burst {
		if !sc.Scan() {
			t.Fatalf("the log ended after %d lines: %v", i, sc.Err())
		}
		if want := fmt.Sprint("line ", i); sc.Text() != want {
			t.Fatalf("line %d is %q, want %q", i, sc.Text(), want)
		}
		if i == before-1 {
			f.h.set(func(h *host) {
				for j := range burst {
					h.logs = append(h.logs, line(before+j))
				}
			})
		}
	}
}
