package native_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/skiff-dev/skiff/sandboxd/internal/sandboxrt"
	"github.com/skiff-dev/skiff/sandboxd/internal/sandboxrt/native"
)

// The disk of an ended sandbox is emptied and kept mounted for the next
// sandbox of its size, which finds none of the last one's files on it;
// one holding more files than a spare may is not kept; a new runtime
// discards the spares an old one left.
func TestSpareDisks(t *testing.T) {
	rt, dir := newRuntime(t)
	ctx := context.Background()
	opts := rt.Options()
	spares := native.SparesDir(opts.Dir)
	disk := func(id string) string { return filepath.Join(opts.Dir, "sandboxes", id, "disk") }
	dev := func(path string) uint64 {
		t.Helper()
		var st unix.Stat_t
		if err := unix.Stat(path, &st); err != nil {
			t.Fatal(err)
		}
		return st.Dev
	}
	kept := func() []string {
		t.Helper()
		entries, err := os.ReadDir(spares)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, e := range entries {
			out = append(out, filepath.Join(spares, e.Name()))
		}
		return out
	}

	a := start(t, rt, dir, nil)
	if got := a.run(t, "root", "echo secret > /root/secret && mkdir -p /home/user/x && echo ok"); got.Stdout != "ok\n" {
		t.Fatalf("write in a: %+v", got)
	}
	devA := dev(disk(a.spec.ID))
	if err := rt.Stop(ctx, a.spec.ID); err != nil {
		t.Fatal(err)
	}
	got := kept()
	if len(got) != 1 || !sandboxrt.IsMountPoint(filepath.Join(got[0], "disk")) {
		t.Fatalf("after a sandbox ended, the spares are %v, want its disk, mounted", got)
	}
	if entries, _ := os.ReadDir(filepath.Join(got[0], "disk")); len(entries) != 1 || entries[0].Name() != "lost+found" {
		t.Errorf("the spare disk holds %v, want lost+found only", entries)
	}

	b := start(t, rt, dir, nil)
	if dev(disk(b.spec.ID)) != devA {
		t.Error("the next sandbox of the same size did not get the spare disk")
	}
	if got := b.run(t, "root", "ls -A /root /home/user; test -e /root/secret && echo LEAKED; echo done"); got.Stdout != "/home/user:\n\n/root:\ndone\n" && got.Stdout != "/root:\n\n/home/user:\ndone\n" {
		t.Errorf("on the reused disk the sandbox sees %q", got.Stdout)
	}
	if len(kept()) != 0 {
		t.Errorf("the spare is still kept after it was taken: %v", kept())
	}

	// Many files: not kept.
	c := start(t, rt, dir, nil)
	if got := c.run(t, "root", "mkdir /root/many && cd /root/many && i=0; while [ $i -lt 5000 ]; do : > f$i; i=$((i+1)); done; echo ok"); got.Stdout != "ok\n" {
		t.Fatalf("many files: %+v", got)
	}
	if err := rt.Stop(ctx, c.spec.ID); err != nil {
		t.Fatal(err)
	}
	if got := kept(); len(got) != 0 {
		t.Errorf("a disk with 5,000 files was kept: %v", got)
	}

	if err := rt.Stop(ctx, b.spec.ID); err != nil {
		t.Fatal(err)
	}
	left := kept()
	if len(left) != 1 {
		t.Fatalf("after b ended, the spares are %v", left)
	}
	// A sandboxd that crashed left it: the next one discards it.
	if _, err := native.New(opts); err != nil {
		t.Fatal(err)
	}
	if got := kept(); len(got) != 0 || sandboxrt.IsMountPoint(filepath.Join(left[0], "disk")) {
		t.Errorf("a new runtime left the spares %v (mounted: %v)", got, sandboxrt.IsMountPoint(filepath.Join(left[0], "disk")))
	}
	if slices.Contains(kept(), left[0]) {
		t.Error("the old spare is still there")
	}
}

// With SpareDisks 0, no disk is kept.
func TestNoSpareDisks(t *testing.T) {
	rt, dir := newRuntime(t, func(o *native.Options) { o.SpareDisks = 0 })
	a := start(t, rt, dir, nil)
	if err := rt.Stop(context.Background(), a.spec.ID); err != nil {
		t.Fatal(err)
	}
	if entries, _ := os.ReadDir(native.SparesDir(rt.Options().Dir)); len(entries) != 0 {
		t.Errorf("spares kept with SpareDisks 0: %v", entries)
	}
}
