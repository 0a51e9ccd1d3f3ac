package main

import (
	"context"
	"encoding/base64"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// procOwner is the uid the kernel gives /proc/<pid>/environ: the process's
// own while it is dumpable, root's once it is not.
func procOwner(t *testing.T, pid string) uint32 {
	t.Helper()
	fi, err := os.Stat("/proc/" + pid + "/environ")
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Uid
}

// TestEnvdIsNotDumpable: envd makes itself non-dumpable at start, and the
// processes it starts are dumpable as before. envd runs as an unprivileged
// user here, so that the owner of its /proc files shows the flag.
func TestEnvdIsNotDumpable(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run envd as another user")
	}
	const nobody = 65534
	in := startEnvd(t, &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}, Pdeathsig: syscall.SIGKILL})
	if uid := procOwner(t, strconv.Itoa(in.pid)); uid != 0 {
		t.Errorf("/proc/<envd>/environ is owned by %d, want 0: envd is dumpable", uid)
	}

	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	r := in.run(ctx, bash(`stat -c %u /proc/$$/environ`), map[string]string{
		"Authorization": "Basic " + base64.StdEncoding.EncodeToString([]byte("nobody:")),
	})
	if r.err != nil {
		t.Fatal(r.err)
	}
	if got := strings.TrimSpace(r.stdout); got != strconv.Itoa(nobody) {
		t.Errorf("a process envd started: /proc/<pid>/environ owned by %q (stderr %q), want %d: dumpable", got, r.stderr, nobody)
	}
}
