package main

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// orphanScript leaves two orphans to envd: a sleep that exits after a
// moment, and a long one that the test kills; it prints their pids.
const orphanScript = `sleep 0.3 & echo $!; nohup sleep 100 >/dev/null 2>&1 & echo $!; exit 0`

// adopted waits until envd's children include n sleeps (orphans it
// adopted) and returns their host pids.
func adopted(t *testing.T, envdPID, n int) []int {
	t.Helper()
	var pids []int
	waitFor(t, 5*time.Second, func() bool {
		pids = pids[:0]
		for _, c := range children(envdPID) {
			if c.comm == "sleep" {
				pids = append(pids, c.pid)
			}
		}
		return len(pids) >= n
	}, fmt.Sprintf("%d orphaned sleeps to be envd's children", n))
	return pids
}

// As PID 1, envd reaps the orphans that come to it: a shell's background
// child that outlives it, whether it exits by itself or is killed.
func TestPID1ReapsOrphans(t *testing.T) {
	in := startEnvd(t, newPIDNamespace())
	r := in.run(t.Context(), bash(orphanScript), nil)
	if r.err != nil || r.end.GetExitCode() != 0 {
		t.Fatalf("run: end %v err %v", r.end, r.err)
	}
	if pids := strings.Fields(r.stdout); len(pids) != 2 {
		t.Fatalf("stdout %q, want two pids", r.stdout)
	}
	adopted(t, in.pid, 1) // the short one may be gone already
	waitFor(t, 5*time.Second, func() bool {
		n := 0
		for _, c := range children(in.pid) {
			if c.comm == "sleep" {
				n++
			}
		}
		return n == 1 && len(zombies(in.pid)) == 0
	}, "the short sleep to exit and be reaped")

	long := adopted(t, in.pid, 1)[0]
	if err := syscall.Kill(long, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, func() bool { return len(children(in.pid)) == 0 }, "the killed orphan to be reaped")

	st := in.stop(t)
	if !st.Exited() || st.ExitCode() != 0 {
		t.Fatalf("envd on SIGTERM: %v, want exit 0", st)
	}
	lines := parseLog(t, in.logText())
	last := lines[len(lines)-1]
	if last.Line != "envd stopped" || last.Reaped == nil || *last.Reaped < 2 {
		t.Fatalf("last line %+v, want envd stopped with orphans_reaped >= 2", last)
	}
}

// Without --init, nothing reaps: the orphan's zombie stays. This is what
// the test above would see if envd did not reap, so the check is sound.
func TestPID1WithoutInitLeavesZombies(t *testing.T) {
	in := startEnvd(t, newPIDNamespace(), "--init=false")
	r := in.run(t.Context(), bash(`sleep 0.1 & exit 0`), nil)
	if r.err != nil {
		t.Fatal(r.err)
	}
	waitFor(t, 5*time.Second, func() bool { return len(zombies(in.pid)) == 1 }, "the orphan's zombie")
	time.Sleep(300 * time.Millisecond)
	if z := zombies(in.pid); len(z) != 1 {
		t.Fatalf("zombies %v, want the orphan's to stay", z)
	}
}

// The reaper never takes the exit status of a process envd started itself,
// even while orphans exit all around: many short commands, each leaving an
// orphan behind, all report their own status.
func TestPID1ExitStatusesUnderLoad(t *testing.T) {
	in := startEnvd(t, newPIDNamespace())
	const n, workers = 240, 16
	type want struct {
		code   int32
		status string
	}
	cases := []struct {
		script string
		want   want
	}{
		{`sleep 0.0$((RANDOM % 5)) & exit 3`, want{3, "exit status 3"}},
		{`(sleep 0.01 &); exit 0`, want{0, "exit status 0"}},
		{`sleep 0.02 & kill -9 $$`, want{-1, "signal: killed"}},
		{`exit 3`, want{3, "exit status 3"}},
	}
	jobs := make(chan int)
	errs := make(chan string, n)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := range jobs {
				c := cases[i%len(cases)]
				r := in.run(t.Context(), bash(c.script), nil)
				switch {
				case r.err != nil:
					errs <- fmt.Sprintf("#%d %q: %v", i, c.script, r.err)
				case r.end == nil:
					errs <- fmt.Sprintf("#%d %q: no end event", i, c.script)
				case r.end.GetExitCode() != c.want.code || r.end.GetStatus() != c.want.status:
					errs <- fmt.Sprintf("#%d %q: exit %d %q, want %d %q", i, c.script, r.end.GetExitCode(), r.end.GetStatus(), c.want.code, c.want.status)
				}
			}
		})
	}
	for i := range n {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	waitFor(t, 10*time.Second, func() bool { return len(children(in.pid)) == 0 }, "every orphan to be reaped")

	// envd logged every exit with its status.
	exits := map[string]int{}
	for _, l := range parseLog(t, in.logText()) {
		if l.Line == "process exited" {
			exits[l.Status]++
		}
	}
	if exits["exit status 3"] != n/2 || exits["exit status 0"] != n/4 || exits["signal: killed"] != n/4 {
		t.Fatalf("logged exits %v, want %d, %d and %d", exits, n/2, n/4, n/4)
	}
}

// --init when envd is not PID 1 makes it a child subreaper: orphans come to
// it and are reaped, and those still running when it stops are killed.
func TestSubreaper(t *testing.T) {
	in := startEnvd(t, nil, "--init")
	r := in.run(t.Context(), bash(orphanScript), nil)
	if r.err != nil {
		t.Fatal(r.err)
	}
	waitFor(t, 5*time.Second, func() bool {
		kids := children(in.pid)
		return len(kids) == 1 && kids[0].comm == "sleep"
	}, "the short orphan reaped and the long one adopted")
	long := children(in.pid)[0].pid
	st := in.stop(t)
	if !st.Exited() || st.ExitCode() != 0 {
		t.Fatalf("envd on SIGTERM: %v, want exit 0", st)
	}
	if err := syscall.Kill(long, 0); err == nil {
		_ = syscall.Kill(long, syscall.SIGKILL)
		t.Fatalf("orphan %d outlived envd", long)
	}
}

// Without --init (and not PID 1), envd leaves orphans to whoever reaps
// them: it does not adopt any.
func TestNotInitByDefault(t *testing.T) {
	in := startEnvd(t, nil)
	r := in.run(t.Context(), bash(`sleep 5 >/dev/null 2>&1 & echo $!`), nil)
	if r.err != nil {
		t.Fatal(r.err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(r.stdout))
	if err != nil {
		t.Fatalf("stdout %q: %v", r.stdout, err)
	}
	defer func() { _ = syscall.Kill(pid, syscall.SIGKILL) }()
	for _, c := range children(in.pid) {
		if c.pid == pid {
			t.Fatalf("envd adopted orphan %d without --init", pid)
		}
	}
	if l := parseLog(t, in.logText())[0]; l.Line != "envd starting" || strings.Contains(in.logText(), `"init":true`) {
		t.Fatalf("first line %+v, want envd starting with init false", l)
	}
}

// The processes envd starts, as PID 1, ignore and block no signal: envd's
// own handling (SIGPIPE, SIGCHLD, SIGTERM...) does not leak into them.
func TestPID1ProcessesGetDefaultSignals(t *testing.T) {
	in := startEnvd(t, newPIDNamespace())
	r := in.run(t.Context(), bash(`grep -E '^Sig(Ign|Blk):' /proc/self/status; yes | head -c 4 | wc -c`), nil)
	if r.err != nil {
		t.Fatal(r.err)
	}
	want := "SigBlk:\t0000000000000000\nSigIgn:\t0000000000000000\n4\n"
	if r.stdout != want {
		t.Fatalf("stdout %q, want %q", r.stdout, want)
	}
}
