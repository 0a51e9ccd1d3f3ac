package template

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLibrary(t *testing.T) {
	lib, err := OpenLibrary(filepath.Join(t.TempDir(), "templates"))
	if err != nil {
		t.Fatal(err)
	}
	manifest, _ := json.Marshal([]map[string]any{{"Config": "0123456789abcdef0123.json", "Layers": []string{"l1.tar", "l2.tar"}}})
	archive := writeArchive(t, map[string][]byte{
		"manifest.json": manifest, "0123456789abcdef0123.json": []byte("{}"),
		"l1.tar": tarOf(t, layer1...), "l2.tar": tarOf(t, layer2...),
	})
	a, err := lib.ImportArchive("base", archive)
	if err != nil {
		t.Fatal(err)
	}
	if a.Version != "0123456789ab" {
		t.Fatalf("version = %q, want the config digest's first 12 characters", a.Version)
	}
	checkImage(t, a.Rootfs)
	again, err := lib.ImportArchive("base", archive)
	if err != nil || again.Version != a.Version || again.Rootfs != a.Rootfs {
		t.Fatalf("re-import = %+v, %v; want the same version", again, err)
	}

	src := t.TempDir()
	if err := os.MkdirAll(filepath.Join(src, "usr/bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "usr/bin/python3"), []byte("py"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("usr/bin", filepath.Join(src, "bin")); err != nil {
		t.Fatal(err)
	}
	py, err := lib.ImportDir("py", src)
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(py.Rootfs, "bin/python3")); err != nil || string(b) != "py" {
		t.Fatalf("copied tree: %q, %v", b, err)
	}
	if fi, err := os.Stat(filepath.Join(py.Rootfs, "usr/bin/python3")); err != nil || fi.Mode().Perm() != 0o755 {
		t.Fatalf("copied mode: %v, %v", fi, err)
	}
	// envd's mount point is there, empty, so that no sandbox makes it;
	// not in the source, nor in an archive's root without /usr/bin.
	if fi, err := os.Lstat(filepath.Join(py.Rootfs, "usr/bin/envd")); err != nil || !fi.Mode().IsRegular() || fi.Size() != 0 {
		t.Fatalf("envd's mount point in the template: %v, %v", fi, err)
	}
	if _, err := os.Lstat(filepath.Join(src, "usr/bin/envd")); err == nil {
		t.Fatal("the import wrote into its source")
	}
	if _, err := os.Lstat(filepath.Join(a.Rootfs, "usr")); !os.IsNotExist(err) {
		t.Fatalf("an image without /usr got one: %v", err)
	}
	// An image's own file there is kept as it is.
	own := t.TempDir()
	if err := os.MkdirAll(filepath.Join(own, "usr/bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(own, "usr/bin/envd"), []byte("e2b's envd"), 0o755); err != nil {
		t.Fatal(err)
	}
	ownT, err := lib.ImportDir("own", own)
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(ownT.Rootfs, "usr/bin/envd")); err != nil || string(b) != "e2b's envd" {
		t.Fatalf("the image's own usr/bin/envd: %q, %v", b, err)
	}
	// Changing the directory makes a new version.
	if err := os.WriteFile(filepath.Join(src, "usr/bin/python3"), []byte("py2"), 0o755); err != nil {
		t.Fatal(err)
	}
	py2, err := lib.ImportDir("py", src)
	if err != nil || py2.Version == py.Version {
		t.Fatalf("re-import of a changed dir = %+v, %v; want a new version", py2, err)
	}

	list, err := lib.List()
	if err != nil || len(list) != 3 || list[0].Name != "base" || list[2].Name != "py" || list[2].Version != py2.Version {
		t.Fatalf("List = %+v, %v", list, err)
	}
	for _, bad := range []string{"", "Base", "-x", "a/b", "..", strings.Repeat("a", 64)} {
		if _, err := lib.ImportDir(bad, src); err == nil {
			t.Errorf("ImportDir(%q) succeeded", bad)
		}
	}
	if _, err := lib.Get("missing"); err == nil {
		t.Error("Get(missing) succeeded")
	}
	if _, err := lib.ImportArchive("broken", filepath.Join(t.TempDir(), "nope.tar")); err == nil {
		t.Error("import of a missing archive succeeded")
	}
	if list, _ := lib.List(); len(list) != 3 {
		t.Errorf("a failed import left a template: %+v", list)
	}
}
