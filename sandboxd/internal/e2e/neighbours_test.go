package e2e

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/skiff-dev/skiff/sandboxd/internal/sandboxtest"
	"github.com/skiff-dev/skiff/sandboxd/internal/template"
	sandboxdv1 "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
)

// answerBound is how long a quiet sandbox's command or a call to sandboxd
// may take while a neighbour misbehaves: not a speed target (those are
// benchmarks), but far past any normal latency, so a failure means the
// neighbour starved it.
const answerBound = 15 * time.Second

// A noisy neighbour: one team's sandbox runs a fork bomb, a thread bomb, an
// inotify flood, a memory bomb and a disk fill at once, each bounded by
// its own limits; meanwhile another team's sandbox keeps answering
// commands, and so does sandboxd's API. The latencies, before and during,
// are logged.
func TestANoisyNeighbourHurtsNoOne(t *testing.T) {
	h := newHostWith(t, func(lib *template.Library) (*template.Template, error) {
		rootfs := sandboxtest.BusyboxRootfs(t)
		sandboxtest.InstallHog(t, rootfs)
		return lib.ImportDir("busybox", rootfs)
	}, "--pids-limit", "1024")
	noisy := h.create(func(r *sandboxdv1.CreateRequest) {
		r.Team = "team-noisy"
		r.Resources = &sandboxdv1.Resources{CpuMilli: 1000, MemoryMib: 256, DiskMib: 256}
	})
	quiet := h.create(func(r *sandboxdv1.CreateRequest) { r.Team = "team-quiet" })
	qid, qtoken := quiet.GetSandbox().GetId(), quiet.GetEnvdAccessToken()

	probe := func() (cmd, api time.Duration) {
		t.Helper()
		began := time.Now()
		if got := h.mustRun(qid, qtoken, "user", "echo ok; hog inotify 3"); !strings.HasPrefix(got.Stdout, "ok\ngot=3 ") {
			t.Errorf("the quiet sandbox answered %+v", got)
		}
		cmd = time.Since(began)
		ctx, cancel := context.WithTimeout(context.Background(), answerBound)
		defer cancel()
		began = time.Now()
		if _, err := h.api.Info(ctx, connect.NewRequest(&sandboxdv1.InfoRequest{})); err != nil {
			t.Errorf("sandboxd's Info: %v", err)
		}
		if _, err := h.api.List(ctx, connect.NewRequest(&sandboxdv1.ListRequest{})); err != nil {
			t.Errorf("sandboxd's List: %v", err)
		}
		api = time.Since(began)
		if cmd > answerBound || api > answerBound {
			t.Errorf("the quiet sandbox took %v to run a command, sandboxd %v to answer", cmd, api)
		}
		return cmd, api
	}
	var before []time.Duration
	for range 5 {
		c, _ := probe()
		before = append(before, c)
	}

	// The attack, for 20 s, in the background of the noisy sandbox: each
	// hog runs until the sandbox's limits stop it, the thread bomb again
	// and again.
	const attack = 20 * time.Second
	script := "(timeout 20 sh -c 'while :; do hog threads 100000 >/dev/null 2>&1; done' &) ; " +
		"(hog procs 100000 hold >/tmp/procs.out 2>&1 &) ; " +
		"(hog inotify 100000 hold >/tmp/inotify.out 2>&1 &) ; " +
		"(for i in 1 2 3 4; do hog mem 200 hold >/dev/null 2>&1 & done) ; " +
		"(dd if=/dev/zero of=/home/user/fill bs=1M count=2048 >/tmp/dd.out 2>&1 &) ; echo started"
	if got := h.mustRun(noisy.GetSandbox().GetId(), noisy.GetEnvdAccessToken(), "user", script); !strings.Contains(got.Stdout, "started") {
		t.Fatalf("the noisy sandbox: %+v", got)
	}
	var during []time.Duration
	var apiWorst time.Duration
	for end := time.Now().Add(attack); time.Now().Before(end); time.Sleep(500 * time.Millisecond) {
		c, a := probe()
		during = append(during, c)
		apiWorst = max(apiWorst, a)
	}
	t.Logf("the quiet sandbox's command: median %v before, median %v and worst %v during the attack; sandboxd's API worst %v",
		median(before), median(during), slices.Max(during), apiWorst)

	// The noisy sandbox was held to its limits: its disk filled and its
	// user got its share of inotify instances, no more. (Its files are
	// read without a process: it may have none left to spare.)
	ctx, cancel := context.WithTimeout(context.Background(), answerBound)
	defer cancel()
	var report strings.Builder
	for _, f := range []string{"/tmp/dd.out", "/tmp/inotify.out", "/tmp/procs.out"} {
		got, err := h.envd(noisy.GetSandbox().GetId()).ReadFile(ctx, "user", noisy.GetEnvdAccessToken(), f)
		if err != nil {
			t.Fatalf("read %s in the noisy sandbox: %v", f, err)
		}
		report.WriteString(got)
	}
	t.Logf("the noisy sandbox's hogs: %s", report.String())
	if got := report.String(); !strings.Contains(got, "No space left on device") || !strings.Contains(got, "err=EMFILE") {
		t.Errorf("the noisy sandbox's hogs were not stopped by its limits: %q", got)
	}
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}
