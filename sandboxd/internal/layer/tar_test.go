package layer

import (
	"archive/tar"
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// sampleLayer makes a layer with every kind of entry a layer keeps.
func sampleLayer(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "layer")
	must(t, os.MkdirAll(filepath.Join(dir, "home/user/app"), 0o750))
	must(t, os.WriteFile(filepath.Join(dir, "home/user/app/a.txt"), []byte("alpha"), 0o640))
	must(t, os.Link(filepath.Join(dir, "home/user/app/a.txt"), filepath.Join(dir, "home/user/b.txt")))
	must(t, os.Symlink("app/a.txt", filepath.Join(dir, "home/user/l")))
	must(t, os.MkdirAll(filepath.Join(dir, "etc"), 0o755))
	must(t, unix.Mknod(filepath.Join(dir, "etc/gone"), unix.S_IFCHR, 0))
	must(t, unix.Mkfifo(filepath.Join(dir, "home/user/fifo"), 0o600))
	must(t, os.MkdirAll(filepath.Join(dir, "opt"), 0o755))
	must(t, unix.Setxattr(filepath.Join(dir, "opt"), opaqueXattr, []byte("y"), 0))
	must(t, unix.Setxattr(filepath.Join(dir, "home/user/app/a.txt"), "user.note", []byte("kept"), 0))
	must(t, os.Chown(filepath.Join(dir, "home/user/app/a.txt"), 1000, 1000))
	must(t, unix.Chmod(filepath.Join(dir, "home/user/app/a.txt"), 0o4755))
	mtime := time.Date(2026, 1, 2, 3, 4, 5, 678901234, time.UTC)
	for _, p := range []string{"home/user/app/a.txt", "home/user/app", "home/user", "home", "etc", "opt", "."} {
		must(t, os.Chtimes(filepath.Join(dir, p), mtime, mtime))
	}
	return dir
}

// A layer sent as WriteTar's tar and unpacked by FromVerifiedTar is the
// same tree: the same tar again, so the same digest.
func TestWriteTarRoundTrip(t *testing.T) {
	needRoot(t)
	src := sampleLayer(t)
	var first bytes.Buffer
	must(t, WriteTar(src, &first))
	want, err := Digest(src)
	must(t, err)
	// Reading the files changes their access times, never the digest.
	if again, _ := Digest(src); again != want {
		t.Fatalf("two digests of one tree: %s, %s", want, again)
	}
	dst := filepath.Join(t.TempDir(), "copy")
	must(t, FromVerifiedTar(bytes.NewReader(first.Bytes()), dst, want))
	got, err := Digest(dst)
	must(t, err)
	if got != want {
		t.Errorf("the copy's digest %s, want the source's %s", got, want)
	}
	if st := stat(t, filepath.Join(dst, "home/user/b.txt")); st.Nlink != 2 || st.Uid != 1000 || st.Mode&0o7777 != 0o4755 {
		t.Errorf("b.txt: links %d uid %d mode %o", st.Nlink, st.Uid, st.Mode&0o7777)
	}
	if v, err := getXattr(filepath.Join(dst, "opt"), opaqueXattr); err != nil || string(v) != "y" {
		t.Errorf("opaque = %q, %v", v, err)
	}

	// One byte changed on the way: refused, and nothing left.
	bad := bytes.Clone(first.Bytes())
	i := bytes.Index(bad, []byte("alpha"))
	bad[i] = 'A'
	dst2 := filepath.Join(t.TempDir(), "bad")
	if err := FromVerifiedTar(bytes.NewReader(bad), dst2, want); !errors.Is(err, ErrDigest) {
		t.Errorf("a changed tar: %v, want ErrDigest", err)
	}
	if _, err := os.Stat(dst2); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a refused tar left %s: %v", dst2, err)
	}
}

// A layer never holds a device but a whiteout.
func TestFromTarRefusesDevices(t *testing.T) {
	needRoot(t)
	for name, hdr := range map[string]*tar.Header{
		"block": {Typeflag: tar.TypeBlock, Name: "/disk", Devmajor: 8, Devminor: 0, Mode: 0o660},
		"char":  {Typeflag: tar.TypeChar, Name: "/mem", Devmajor: 1, Devminor: 1, Mode: 0o660},
	} {
		t.Run(name, func(t *testing.T) {
			if err := FromTar(tarOf(t, hdr), filepath.Join(t.TempDir(), "layer")); err == nil {
				t.Fatal("unpacked a device node")
			}
		})
	}
}
