package template

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

type ent struct {
	name string
	typ  byte
	body string
	link string
	mode int64
}

func tarOf(t *testing.T, ents ...ent) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range ents {
		mode := e.mode
		if mode == 0 {
			mode = 0o644
			if e.typ == tar.TypeDir {
				mode = 0o755
			}
		}
		hdr := &tar.Header{Name: e.name, Typeflag: e.typ, Linkname: e.link, Mode: mode, Size: int64(len(e.body)), ModTime: time.Unix(1700000000, 0)}
		if e.typ != tar.TypeReg {
			hdr.Size = 0
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if e.typ == tar.TypeReg {
			if _, err := tw.Write([]byte(e.body)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func gz(t *testing.T, data []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	w := gzip.NewWriter(&buf)
	_, _ = w.Write(data)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func digest(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func writeArchive(t *testing.T, files map[string][]byte) string {
	t.Helper()
	var ents []ent
	for name, body := range files {
		ents = append(ents, ent{name: name, typ: tar.TypeReg, body: string(body)})
	}
	p := filepath.Join(t.TempDir(), "image.tar")
	if err := os.WriteFile(p, tarOf(t, ents...), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

var (
	layer1 = []ent{
		{name: "bin/", typ: tar.TypeDir},
		{name: "bin/sh", typ: tar.TypeReg, body: "sh1", mode: 0o755},
		{name: "bin/su", typ: tar.TypeReg, body: "su", mode: 0o4755},
		{name: "bin/link", typ: tar.TypeSymlink, link: "sh"},
		{name: "bin/hard", typ: tar.TypeLink, link: "bin/su"},
		{name: "etc/conf", typ: tar.TypeReg, body: "c1"}, // parent made implicitly
		{name: "./d/", typ: tar.TypeDir},
		{name: "d/a", typ: tar.TypeReg, body: "a"},
		{name: "d/b", typ: tar.TypeReg, body: "b"},
		{name: "dev/null", typ: tar.TypeChar},
	}
	layer2 = []ent{
		{name: "etc/.wh.conf", typ: tar.TypeReg},
		{name: "d/.wh..wh..opq", typ: tar.TypeReg},
		{name: "d/c", typ: tar.TypeReg, body: "c"},
		{name: "bin/sh", typ: tar.TypeReg, body: "sh2", mode: 0o755},
	}
)

func checkImage(t *testing.T, dest string) {
	t.Helper()
	read := func(p string) string {
		b, err := os.ReadFile(filepath.Join(dest, p))
		if err != nil {
			return "<" + err.Error() + ">"
		}
		return string(b)
	}
	for p, want := range map[string]string{"bin/sh": "sh2", "bin/su": "su", "d/c": "c", "bin/link": "sh2"} {
		if got := read(p); got != want {
			t.Errorf("%s = %q, want %q", p, got, want)
		}
	}
	for _, gone := range []string{"etc/conf", "d/a", "d/b", "dev/null"} {
		if _, err := os.Lstat(filepath.Join(dest, gone)); !os.IsNotExist(err) {
			t.Errorf("%s: %v, want it gone (whiteout, opaque dir, or a skipped device)", gone, err)
		}
	}
	if target, err := os.Readlink(filepath.Join(dest, "bin/link")); err != nil || target != "sh" {
		t.Errorf("bin/link -> %q, %v", target, err)
	}
	su, err1 := os.Stat(filepath.Join(dest, "bin/su"))
	hard, err2 := os.Stat(filepath.Join(dest, "bin/hard"))
	if err1 != nil || err2 != nil || !os.SameFile(su, hard) {
		t.Errorf("bin/hard is not a hard link of bin/su: %v %v", err1, err2)
	}
	if su != nil && (su.Mode()&fs.ModeSetuid == 0 || su.Mode().Perm() != 0o755) {
		t.Errorf("bin/su mode = %v, want setuid 0755", su.Mode())
	}
	if fi, err := os.Stat(filepath.Join(dest, "bin/sh")); err != nil || !fi.ModTime().Equal(time.Unix(1700000000, 0)) {
		t.Errorf("bin/sh mtime = %v, %v", fi, err)
	}
}

func TestDockerSaveArchive(t *testing.T) {
	l1, l2 := tarOf(t, layer1...), gz(t, tarOf(t, layer2...))
	manifest, _ := json.Marshal([]map[string]any{{"Config": "cfg.json", "RepoTags": []string{"x:1"}, "Layers": []string{"l1/layer.tar", "l2/layer.tar"}}})
	archive := writeArchive(t, map[string][]byte{"manifest.json": manifest, "cfg.json": []byte("{}"), "l1/layer.tar": l1, "l2/layer.tar": l2})
	dest := filepath.Join(t.TempDir(), "rootfs")
	img, err := UnpackArchive(archive, dest)
	if err != nil {
		t.Fatal(err)
	}
	if img.Layers != 2 {
		t.Fatalf("layers = %d", img.Layers)
	}
	checkImage(t, dest)
}

func ociArchive(t *testing.T, tamper bool) string {
	t.Helper()
	l1, l2 := gz(t, tarOf(t, layer1...)), tarOf(t, layer2...)
	cfg := []byte(`{"architecture":"amd64","os":"linux"}`)
	manifest, _ := json.Marshal(map[string]any{
		"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
		"config": map[string]any{"mediaType": "application/vnd.oci.image.config.v1+json", "digest": "sha256:" + digest(cfg)},
		"layers": []map[string]any{
			{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": "sha256:" + digest(l1)},
			{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": "sha256:" + digest(l2)},
		},
	})
	index, _ := json.Marshal(map[string]any{"schemaVersion": 2, "manifests": []map[string]any{
		{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": "sha256:" + digest(manifest), "platform": map[string]string{"os": "linux", "architecture": "amd64"}},
	}})
	files := map[string][]byte{
		"oci-layout": []byte(`{"imageLayoutVersion":"1.0.0"}`), "index.json": index,
		"blobs/sha256/" + digest(manifest): manifest, "blobs/sha256/" + digest(cfg): cfg,
		"blobs/sha256/" + digest(l1): l1, "blobs/sha256/" + digest(l2): l2,
	}
	if tamper {
		files["blobs/sha256/"+digest(l2)] = tarOf(t, ent{name: "evil", typ: tar.TypeReg, body: "x"})
	}
	return writeArchive(t, files)
}

func TestOCIArchive(t *testing.T) {
	dest := filepath.Join(t.TempDir(), "rootfs")
	img, err := UnpackArchive(ociArchive(t, false), dest)
	if err != nil {
		t.Fatal(err)
	}
	if img.Layers != 2 || !strings.HasPrefix(img.Digest, "sha256:") {
		t.Fatalf("image = %+v", img)
	}
	checkImage(t, dest)

	_, err = UnpackArchive(ociArchive(t, true), filepath.Join(t.TempDir(), "rootfs"))
	if err == nil || !strings.Contains(err.Error(), "digest is") {
		t.Fatalf("tampered layer = %v, want a digest error", err)
	}
}

// No entry, symlink or hard link reaches outside the destination.
func TestEscapesFail(t *testing.T) {
	for _, tc := range []struct {
		name  string
		layer []ent
	}{
		{"dot-dot", []ent{{name: "../outside", typ: tar.TypeReg, body: "x"}}},
		{"write through an absolute symlink", []ent{{name: "evil", typ: tar.TypeSymlink, link: "/"}, {name: "evil/outside", typ: tar.TypeReg, body: "x"}}},
		{"write through a climbing symlink", []ent{{name: "evil", typ: tar.TypeSymlink, link: "../.."}, {name: "evil/outside", typ: tar.TypeReg, body: "x"}}},
		{"hard link out", []ent{{name: "h", typ: tar.TypeLink, link: "../../etc/passwd"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := t.TempDir()
			dest := filepath.Join(base, "a", "rootfs")
			manifest, _ := json.Marshal([]map[string]any{{"Config": "c.json", "Layers": []string{"l.tar"}}})
			archive := writeArchive(t, map[string][]byte{"manifest.json": manifest, "c.json": []byte("{}"), "l.tar": tarOf(t, tc.layer...)})
			if _, err := UnpackArchive(archive, dest); err == nil {
				t.Fatal("unpack succeeded, want an error")
			}
			for _, p := range []string{filepath.Join(base, "a", "outside"), filepath.Join(base, "outside"), "/outside"} {
				if _, err := os.Lstat(p); !os.IsNotExist(err) {
					t.Fatalf("%s exists: the layer escaped", p)
				}
			}
		})
	}
}

func TestNotAnImage(t *testing.T) {
	archive := writeArchive(t, map[string][]byte{"hello.txt": []byte("hi")})
	if _, err := UnpackArchive(archive, t.TempDir()); err == nil || !strings.Contains(err.Error(), "neither an OCI layout") {
		t.Fatalf("err = %v", err)
	}
	if _, err := UnpackArchive(filepath.Join(t.TempDir(), "missing.tar"), t.TempDir()); err == nil {
		t.Fatal("a missing archive unpacked")
	}
}

func TestOwnership(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("chown needs root")
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	_ = tw.WriteHeader(&tar.Header{Name: "home/user/f", Typeflag: tar.TypeReg, Mode: 0o600, Uid: 1000, Gid: 1000, Size: 1})
	_, _ = tw.Write([]byte("x"))
	_ = tw.Close()
	manifest, _ := json.Marshal([]map[string]any{{"Config": "c.json", "Layers": []string{"l.tar"}}})
	dest := filepath.Join(t.TempDir(), "rootfs")
	if _, err := UnpackArchive(writeArchive(t, map[string][]byte{"manifest.json": manifest, "c.json": []byte("{}"), "l.tar": buf.Bytes()}), dest); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dest, "home/user/f"))
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); st.Uid != 1000 || st.Gid != 1000 {
		t.Fatalf("owner = %d:%d, want 1000:1000", st.Uid, st.Gid)
	}
}
