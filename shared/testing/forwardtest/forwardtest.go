// Package forwardtest keeps net.ipv4.ip_forward on for tests whose sandboxd
// turns it on, and puts back the machine's own value when the last of them
// ends, also across test binaries that run side by side (go test runs
// packages in parallel).
//
// A test that restored the value it read at its start would switch
// forwarding off under another test that still needs it: its sandboxes'
// traffic through this host would then time out.
package forwardtest

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

const sysctl = "/proc/sys/net/ipv4/ip_forward"

// Dir holds the lock and the machine's value; a tmpfs, so a reboot forgets
// them with the value itself.
var Dir = "/run/skiff-test"

// Keep registers the test as one that needs forwarding until it ends. The
// first of the tests running at once records the machine's value; the last
// to end writes it back. A test that dies without its cleanups lets go of
// its hold with its process.
func Keep(tb testing.TB) {
	tb.Helper()
	if err := os.MkdirAll(Dir, 0o755); err != nil {
		tb.Fatal(err)
	}
	lock, saved := filepath.Join(Dir, "ip_forward.lock"), filepath.Join(Dir, "ip_forward.saved")
	f, err := os.OpenFile(lock, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		tb.Fatal(err)
	}
	fd := int(f.Fd())
	// Alone: record the machine's value. Else another holder has.
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err == nil {
		v, err := os.ReadFile(sysctl)
		if err != nil {
			tb.Fatal(err)
		}
		if err := os.WriteFile(saved, v, 0o600); err != nil {
			tb.Fatal(err)
		}
	} else if !errors.Is(err, unix.EWOULDBLOCK) {
		tb.Fatal(err)
	}
	if err := unix.Flock(fd, unix.LOCK_SH); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		defer f.Close()
		if err := unix.Flock(fd, unix.LOCK_UN); err != nil {
			tb.Error(err)
			return
		}
		if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
			return // others still need it; the last one restores
		}
		v, err := os.ReadFile(saved)
		if err != nil {
			tb.Errorf("forwardtest: the machine's ip_forward: %v", err)
			return
		}
		if cur, _ := os.ReadFile(sysctl); string(cur) != string(v) {
			if err := os.WriteFile(sysctl, v, 0o644); err != nil {
				tb.Errorf("forwardtest: restore ip_forward: %v", err)
			}
		}
	})
}
