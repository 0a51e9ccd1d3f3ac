package volume

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/skiff-dev/skiff/sandboxd/internal/diskimage"
	"github.com/skiff-dev/skiff/sandboxd/internal/sandboxrt"
)

func openStore(t *testing.T, o Options) *Store {
	t.Helper()
	if o.Dir == "" {
		o.Dir = t.TempDir()
	}
	if o.MountDir == "" {
		o.MountDir = t.TempDir()
	}
	if o.Node == "" {
		o.Node = "node-a"
	}
	s, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestStore: create, names unique per team, get by ID and name, another
// team's invisible, list, leases keeping a volume from deletion, delete.
func TestStore(t *testing.T) {
	s := openStore(t, Options{})
	v, err := s.Create("team-a", "work_1")
	if err != nil {
		t.Fatal(err)
	}
	if !ValidID(v.ID) || v.Team != "team-a" || v.Name != "work_1" || v.SizeMiB != 0 {
		t.Fatalf("Create = %+v", v)
	}
	root, err := s.Root(v)
	if err != nil {
		t.Fatal(err)
	}
	if info, err := os.Stat(root); err != nil || info.Mode().Perm() != 0o777 {
		t.Fatalf("root %s: %v, %v; want a directory of mode 0777", root, info, err)
	}
	if _, err := s.Create("team-a", "work_1"); !errors.Is(err, ErrExists) {
		t.Errorf("a second volume of the name: %v", err)
	}
	if w, err := s.Create("team-b", "work_1"); err != nil || w.ID == v.ID {
		t.Errorf("another team's volume of the name: %+v, %v", w, err)
	}
	for _, bad := range []string{"", "a b", "a/b", "..", strings.Repeat("x", MaxNameBytes+1)} {
		if _, err := s.Create("team-a", bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("name %q: %v", bad, err)
		}
	}
	if _, err := s.Create("Team A", "x"); !errors.Is(err, ErrInvalid) {
		t.Errorf("a bad team: %v", err)
	}
	if got, err := s.Get("team-a", "", "work_1"); err != nil || got.ID != v.ID {
		t.Errorf("Get by name = %+v, %v", got, err)
	}
	if got, err := s.Get("team-a", v.ID, ""); err != nil || got.Name != "work_1" {
		t.Errorf("Get by ID = %+v, %v", got, err)
	}
	if _, err := s.Get("team-b", v.ID, ""); !errors.Is(err, ErrNotFound) {
		t.Errorf("another team's Get: %v", err)
	}
	if _, err := s.Get("team-a", "not-a-uuid", ""); !errors.Is(err, ErrNotFound) {
		t.Errorf("a bad ID: %v", err)
	}
	if vs, _ := s.List("team-a"); len(vs) != 1 || vs[0].ID != v.ID {
		t.Errorf("List(team-a) = %v", vs)
	}
	if vs, _ := s.List(""); len(vs) != 2 {
		t.Errorf("List() = %v", vs)
	}

	if err := os.WriteFile(filepath.Join(root, "f"), []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	if used := s.Used(t.Context(), v); used <= 0 {
		t.Errorf("Used = %d", used)
	}
	// A walk that does not end in time says nothing (GetVolume bounds it).
	ended, cancel := context.WithCancel(t.Context())
	cancel()
	if used := s.Used(ended, v); used != -1 {
		t.Errorf("Used with its time up = %d, want -1 (unknown)", used)
	}
	if err := s.Hold(v, "sbx1"); err != nil {
		t.Fatal(err)
	}
	live := func(l Lease) bool { return l.Sandbox == "sbx1" }
	if err := s.Delete("team-a", v.ID, live); !errors.Is(err, ErrInUse) || !strings.Contains(err.Error(), "sbx1") {
		t.Errorf("Delete of a held volume: %v", err)
	}
	if own, _ := s.OwnLeases(); len(own[v.ID]) != 1 {
		t.Errorf("OwnLeases = %v", own)
	}
	// A stale lease (its sandbox not live) does not keep it.
	if err := s.Delete("team-a", v.ID, func(Lease) bool { return false }); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get("team-a", v.ID, ""); !errors.Is(err, ErrNotFound) {
		t.Errorf("after Delete: %v", err)
	}
	if _, err := os.Stat(root); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("its files after Delete: %v", err)
	}
	if err := s.Delete("team-a", v.ID, live); !errors.Is(err, ErrNotFound) {
		t.Errorf("a second Delete: %v", err)
	}
	// The name is free again.
	if _, err := s.Create("team-a", "work_1"); err != nil {
		t.Errorf("the name after Delete: %v", err)
	}
}

// A crashed create leaves a record without its name: not a volume, and
// Open removes it; a shared store waits an hour, as another host may be
// in the middle of one.
func TestGCAndSharedStore(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, Options{Dir: dir})
	orphan := &Volume{Schema: SchemaVersion, ID: newUUID(), Team: "team-a", Name: "lost"}
	b, _ := json.Marshal(orphan)
	if err := writeDurable(s.recordPath(orphan.ID), b); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(s.dataPath(orphan), 0o777); err != nil {
		t.Fatal(err)
	}
	if vs, _ := s.List(""); len(vs) != 0 {
		t.Fatalf("a record without its name is listed: %v", vs)
	}
	shared := openStore(t, Options{Dir: dir, Shared: true})
	if _, err := os.Stat(s.recordPath(orphan.ID)); err != nil {
		t.Fatalf("a shared store removed a fresh record: %v", err)
	}
	if shared.SharedID() == "" || openStore(t, Options{Dir: dir, Shared: true, Node: "node-b"}).SharedID() != shared.SharedID() {
		t.Errorf("the shared store's ID differs between hosts")
	}
	// A create cut short before its record: its folder alone.
	early := &Volume{ID: newUUID()}
	if err := os.Mkdir(s.dataPath(early), 0o777); err != nil {
		t.Fatal(err)
	}
	openStore(t, Options{Dir: dir})
	if _, err := os.Stat(s.dataPath(early)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the folder of a create without a record after Open: %v", err)
	}
	if _, err := os.Stat(s.recordPath(orphan.ID)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the orphan record after Open: %v", err)
	}
	if _, err := os.Stat(s.dataPath(orphan)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the orphan's files after Open: %v", err)
	}
	if _, err := Open(Options{Dir: dir, MountDir: t.TempDir(), Shared: true, SizeMiB: 64}); err == nil {
		t.Error("a shared store of images opened")
	}
}

// An image volume: its size enforced (ENOSPC past it), what it uses told
// by statfs, mounted again after it was unmounted (a reboot), gone with
// its image on delete.
func TestImageVolume(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: loop devices and mounts")
	}
	if err := diskimage.Check("volumes"); err != nil {
		t.Skip(err)
	}
	s := openStore(t, Options{SizeMiB: 64})
	v, err := s.Create("team-a", "img")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Delete("team-a", v.ID, func(Lease) bool { return false }) })
	root, err := s.Root(v)
	if err != nil {
		t.Fatal(err)
	}
	if entries, _ := os.ReadDir(root); len(entries) != 0 {
		t.Errorf("a new volume holds %v (lost+found must stay out of it)", entries)
	}
	big := make([]byte, 80<<20)
	err = os.WriteFile(filepath.Join(root, "big"), big, 0o644)
	if !errors.Is(err, unix.ENOSPC) {
		t.Errorf("writing 80 MiB to a 64 MiB volume: %v, want ENOSPC", err)
	}
	_ = os.Remove(filepath.Join(root, "big"))
	if err := os.WriteFile(filepath.Join(root, "kept"), make([]byte, 4<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	if used := s.Used(t.Context(), v); used < 4<<20 || used > 40<<20 {
		t.Errorf("Used = %d, want about 4 MiB and the filesystem's own", used)
	}
	// A reboot unmounts it; Root mounts it again, with its files. A mount
	// namespace made while it was mounted (a sandbox starting, on a host
	// whose mounts are private) still holds the filesystem, its last
	// writes unwritten: the new mount must be that filesystem, not a
	// second one built from the image's stale blocks.
	holdCopy(t)
	if err := unix.Unmount(s.mountPath(v.ID), 0); err != nil {
		t.Fatal(err)
	}
	if root, err = s.Root(v); err != nil {
		t.Fatal(err)
	}
	if info, err := os.Stat(filepath.Join(root, "kept")); err != nil || info.Size() != 4<<20 {
		t.Errorf("after a remount: %v, %v", info, err)
	}
	if err := s.Delete("team-a", v.ID, func(Lease) bool { return false }); err != nil {
		t.Fatal(err)
	}
	if sandboxrt.IsMountPoint(s.mountPath(v.ID)) {
		t.Error("still mounted after Delete")
	}
	if _, err := os.Stat(s.imagePath(v.ID)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the image after Delete: %v", err)
	}
}

// holdCopy starts a process in a mount namespace of its own, holding a
// private copy of every mount of this one until the test ends.
func holdCopy(t *testing.T) {
	t.Helper()
	cmd := exec.Command("sleep", "60")
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
}

// TestDeleteTwiceKeepsTheNewName: two deletes of one volume both find it;
// the first removes it and a new volume takes its name before the second
// gets the volume's lock. The second finds it gone, and the new volume
// keeps its name (and so its files at the next start).
func TestDeleteTwiceKeepsTheNewName(t *testing.T) {
	s := openStore(t, Options{})
	v, err := s.Create("team-a", "again")
	if err != nil {
		t.Fatal(err)
	}
	noneLive := func(Lease) bool { return false }
	if err := s.Delete("team-a", v.ID, noneLive); err != nil {
		t.Fatal(err)
	}
	w, err := s.Create("team-a", "again")
	if err != nil {
		t.Fatal(err)
	}
	unlock := s.lock(v.ID)
	err = s.deleteLocked(v, noneLive) // the second delete, found before the first
	unlock()
	if !errors.Is(err, ErrNotFound) {
		t.Fatalf("the second delete: %v, want ErrNotFound", err)
	}
	if got, err := s.Get("team-a", "", "again"); err != nil || got.ID != w.ID {
		t.Fatalf("the new volume of the name: %+v, %v; want %s", got, err, w.ID)
	}
}

// TestEmptyNameReclaimed: a name file left empty (a create of an older
// sandboxd that crashed between making it and writing it) does not hold
// the name forever; and a name is written whole or not at all.
func TestEmptyNameReclaimed(t *testing.T) {
	s := openStore(t, Options{})
	if err := os.MkdirAll(filepath.Dir(s.namePath("team-a", "stuck")), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(s.namePath("team-a", "stuck"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	v, err := s.Create("team-a", "stuck")
	if err != nil {
		t.Fatalf("create over an empty name: %v", err)
	}
	if owner, err := s.nameOwner("team-a", "stuck"); err != nil || owner != v.ID {
		t.Fatalf("the name holds %q, %v; want %s", owner, err, v.ID)
	}
	tmps, _ := filepath.Glob(filepath.Join(s.opts.Dir, "records", ".tmp-*"))
	if len(tmps) != 0 {
		t.Fatalf("temporary files left: %v", tmps)
	}
}
