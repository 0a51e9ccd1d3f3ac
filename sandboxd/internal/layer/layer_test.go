package layer

import (
	"archive/tar"
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: layers keep owners, devices and trusted xattrs")
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func stat(t *testing.T, path string) unix.Stat_t {
	t.Helper()
	var st unix.Stat_t
	must(t, unix.Lstat(path, &st))
	return st
}

// An upper layer as a native sandbox leaves it (owners base + n, a
// whiteout, an opaque directory, a symlink, a hard link, a setuid file)
// copies into a layer owned as inside the sandbox, with what overlayfs
// reads of it.
func TestCopyUpper(t *testing.T) {
	needRoot(t)
	const base = 1_000_000_000
	src, dst := t.TempDir(), filepath.Join(t.TempDir(), "layer")
	must(t, os.MkdirAll(filepath.Join(src, "home/user/app"), 0o755))
	must(t, os.WriteFile(filepath.Join(src, "home/user/app/data.txt"), []byte("important data"), 0o640))
	must(t, os.Link(filepath.Join(src, "home/user/app/data.txt"), filepath.Join(src, "home/user/twin")))
	must(t, os.Symlink("app/data.txt", filepath.Join(src, "home/user/link")))
	must(t, unix.Mknod(filepath.Join(src, "home/user/gone"), unix.S_IFCHR, 0))
	must(t, os.Mkdir(filepath.Join(src, "opt"), 0o755))
	must(t, unix.Setxattr(filepath.Join(src, "opt"), opaqueXattr, []byte("y"), 0))
	must(t, unix.Setxattr(filepath.Join(src, "home/user/app/data.txt"), "user.note", []byte("kept"), 0))
	must(t, os.WriteFile(filepath.Join(src, "suid"), []byte("x"), 0o755))
	// A sparse file: 1 GiB long, one block of data.
	sparse, err := os.Create(filepath.Join(src, "sparse"))
	must(t, err)
	_, err = sparse.WriteAt([]byte("end"), 1<<30)
	must(t, err)
	must(t, sparse.Close())
	for _, p := range []string{".", "home", "home/user", "home/user/app", "home/user/app/data.txt", "home/user/link", "home/user/gone", "opt", "suid"} {
		must(t, unix.Lchown(filepath.Join(src, p), base+1000, base+1000))
	}
	must(t, unix.Chmod(filepath.Join(src, "suid"), 0o4755))
	must(t, unix.Lchown(filepath.Join(src, "."), base, base))
	must(t, unix.Lchown(filepath.Join(src, "opt"), 7, 7)) // a host owner outside the range
	mtime := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	must(t, os.Chtimes(filepath.Join(src, "home/user/app"), mtime, mtime))

	must(t, CopyUpper(src, dst, base))

	if data, err := os.ReadFile(filepath.Join(dst, "home/user/app/data.txt")); err != nil || string(data) != "important data" {
		t.Fatalf("data.txt = %q, %v", data, err)
	}
	if st := stat(t, filepath.Join(dst, "home/user/app/data.txt")); st.Uid != 1000 || st.Gid != 1000 || st.Mode&0o7777 != 0o640 || st.Nlink != 2 {
		t.Errorf("data.txt: uid %d gid %d mode %o links %d, want 1000 1000 640 2", st.Uid, st.Gid, st.Mode&0o7777, st.Nlink)
	}
	if a, b := stat(t, filepath.Join(dst, "home/user/app/data.txt")), stat(t, filepath.Join(dst, "home/user/twin")); a.Ino != b.Ino {
		t.Error("the hard link was copied as a second file")
	}
	if target, err := os.Readlink(filepath.Join(dst, "home/user/link")); err != nil || target != "app/data.txt" {
		t.Errorf("link = %q, %v", target, err)
	}
	if st := stat(t, filepath.Join(dst, "home/user/gone")); st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 {
		t.Errorf("whiteout: mode %o rdev %d, want a 0/0 character device", st.Mode, st.Rdev)
	}
	if v, err := getXattr(filepath.Join(dst, "opt"), opaqueXattr); err != nil || string(v) != "y" {
		t.Errorf("opaque xattr = %q, %v", v, err)
	}
	if v, err := getXattr(filepath.Join(dst, "home/user/app/data.txt"), "user.note"); err != nil || string(v) != "kept" {
		t.Errorf("user xattr = %q, %v", v, err)
	}
	if st := stat(t, filepath.Join(dst, "opt")); st.Uid != overflowID {
		t.Errorf("a host owner outside the sandbox's range became %d, want %d", st.Uid, overflowID)
	}
	if st := stat(t, dst); st.Uid != 0 {
		t.Errorf("layer root owned by %d, want 0", st.Uid)
	}
	if st := stat(t, filepath.Join(dst, "suid")); st.Mode&0o7777 != 0o4755 {
		t.Errorf("suid mode %o, want 4755", st.Mode&0o7777)
	}
	if st := stat(t, filepath.Join(dst, "home/user/app")); st.Mtim.Sec != mtime.Unix() {
		t.Errorf("directory mtime %d, want %d", st.Mtim.Sec, mtime.Unix())
	}
	if st := stat(t, filepath.Join(dst, "sparse")); st.Size != 1<<30+3 || st.Blocks*512 > 1<<20 {
		t.Errorf("sparse file: size %d, %d bytes allocated; want its size and its holes kept", st.Size, st.Blocks*512)
	}
	if n, err := Size(dst); err != nil || n <= 0 {
		t.Errorf("Size = %d, %v", n, err)
	}
}

func tarOf(t *testing.T, hdrs ...*tar.Header) *bytes.Buffer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range hdrs {
		if h.Format == tar.FormatUnknown && len(h.PAXRecords) > 0 {
			h.Format = tar.FormatPAX
		}
		must(t, tw.WriteHeader(h))
		if h.Typeflag == tar.TypeReg {
			_, err := tw.Write([]byte(strings.Repeat("x", int(h.Size))))
			must(t, err)
		}
	}
	must(t, tw.Close())
	return &buf
}

func TestFromTar(t *testing.T) {
	needRoot(t)
	dst := filepath.Join(t.TempDir(), "layer")
	buf := tarOf(t,
		&tar.Header{Typeflag: tar.TypeDir, Name: "/", Mode: 0o755},
		&tar.Header{Typeflag: tar.TypeDir, Name: "/home/user/", Mode: 0o750, Uid: 1000, Gid: 1000},
		&tar.Header{Typeflag: tar.TypeReg, Name: "/home/user/a.txt", Mode: 0o644, Size: 3, Uid: 1000, Gid: 1000},
		&tar.Header{Typeflag: tar.TypeLink, Name: "/home/user/b.txt", Linkname: "/home/user/a.txt"},
		&tar.Header{Typeflag: tar.TypeChar, Name: "/etc/gone"},
		&tar.Header{Typeflag: tar.TypeDir, Name: "/opt/", Mode: 0o755, PAXRecords: map[string]string{"SCHILY.xattr." + opaqueXattr: "y"}},
		&tar.Header{Typeflag: tar.TypeSymlink, Name: "/home/user/l", Linkname: "/etc/passwd"},
	)
	must(t, FromTar(buf, dst))
	if st := stat(t, filepath.Join(dst, "home/user/a.txt")); st.Uid != 1000 || st.Size != 3 || st.Nlink != 2 {
		t.Errorf("a.txt: uid %d size %d links %d", st.Uid, st.Size, st.Nlink)
	}
	if st := stat(t, filepath.Join(dst, "home/user")); st.Mode&0o777 != 0o750 || st.Uid != 1000 {
		t.Errorf("home/user: mode %o uid %d", st.Mode&0o777, st.Uid)
	}
	if st := stat(t, filepath.Join(dst, "etc/gone")); st.Mode&unix.S_IFMT != unix.S_IFCHR {
		t.Errorf("whiteout mode %o", st.Mode)
	}
	if v, err := getXattr(filepath.Join(dst, "opt"), opaqueXattr); err != nil || string(v) != "y" {
		t.Errorf("opaque = %q, %v", v, err)
	}
}

// A directory entry over a symlink (or over a second name of one) that an
// earlier entry made is refused, and changes nothing the symlink leads to:
// the mode, owner and times FromTar sets by the entry's host path would
// otherwise be the target's, a host file's as root.
func TestFromTarChangesNothingThroughASymlink(t *testing.T) {
	needRoot(t)
	victim := filepath.Join(t.TempDir(), "victim")
	must(t, os.WriteFile(victim, nil, 0o600))
	for name, hdrs := range map[string][]*tar.Header{
		"a directory over a symlink": {
			{Typeflag: tar.TypeSymlink, Name: "/x", Linkname: victim},
			{Typeflag: tar.TypeDir, Name: "/x/", Mode: 0o6777, Uid: 1000},
		},
		"a directory over a second name of a symlink": {
			{Typeflag: tar.TypeSymlink, Name: "/x", Linkname: victim},
			{Typeflag: tar.TypeLink, Name: "/y", Linkname: "/x"},
			{Typeflag: tar.TypeDir, Name: "/y/", Mode: 0o6777, Uid: 1000},
		},
	} {
		t.Run(name, func(t *testing.T) {
			if err := FromTar(tarOf(t, hdrs...), filepath.Join(t.TempDir(), "layer")); err == nil {
				t.Error("unpacked")
			}
			if st := stat(t, victim); st.Mode&0o7777 != 0o600 || st.Uid != 0 {
				t.Fatalf("the file the symlink leads to has mode %o and owner %d, want 600 and 0", st.Mode&0o7777, st.Uid)
			}
		})
	}
}

// A sandbox writes its upper layer: a tar of it cannot reach outside the
// layer, through "..", or through a symlink it made.
func TestFromTarStaysInside(t *testing.T) {
	needRoot(t)
	outside := t.TempDir()
	for name, hdrs := range map[string][]*tar.Header{
		"dot-dot": {{Typeflag: tar.TypeReg, Name: "../../escape", Mode: 0o644}},
		"through a symlink": {
			{Typeflag: tar.TypeSymlink, Name: "/evil", Linkname: outside},
			{Typeflag: tar.TypeChar, Name: "/evil/dev", Devmajor: 1, Devminor: 3},
		},
		"a hard link out": {{Typeflag: tar.TypeLink, Name: "/x", Linkname: "../../../etc/passwd"}},
		"through a second name of a symlink": {
			{Typeflag: tar.TypeSymlink, Name: "/s", Linkname: outside},
			{Typeflag: tar.TypeLink, Name: "/h", Linkname: "/s"},
			{Typeflag: tar.TypeFifo, Name: "/h/fifo", Mode: 0o644},
		},
	} {
		t.Run(name, func(t *testing.T) {
			dst := filepath.Join(t.TempDir(), "layer")
			if err := FromTar(tarOf(t, hdrs...), dst); err == nil {
				t.Fatal("unpacked")
			}
			entries, _ := os.ReadDir(outside)
			if len(entries) != 0 {
				t.Fatalf("%d entries appeared outside the layer", len(entries))
			}
		})
	}
}
