package image

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// entries reads a tar into name → header and content.
func entries(t *testing.T, r io.Reader) (map[string]*tar.Header, map[string][]byte) {
	t.Helper()
	hdrs, data := map[string]*tar.Header{}, map[string][]byte{}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return hdrs, data
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		hdrs[h.Name], data[h.Name] = h, b
	}
}

// TestWrite: the archive is what docker load reads: a manifest naming the
// config and the layers, the config's diff_ids the layers' SHA-256s, and
// the layers the files with their modes, links and owners.
func TestWrite(t *testing.T) {
	root := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(root, "etc"), 0o755))
	must(os.WriteFile(filepath.Join(root, "etc", "os-release"), []byte("ID=debian\n"), 0o644))
	must(os.MkdirAll(filepath.Join(root, "usr", "bin"), 0o755))
	must(os.WriteFile(filepath.Join(root, "usr", "bin", "tool"), []byte("#!/bin/sh\n"), 0o755))
	must(os.Link(filepath.Join(root, "usr", "bin", "tool"), filepath.Join(root, "usr", "bin", "tool2")))
	must(os.Symlink("usr/bin", filepath.Join(root, "bin")))
	bin := filepath.Join(t.TempDir(), "sandboxd")
	must(os.WriteFile(bin, []byte("\x7fELF…"), 0o750))

	var out bytes.Buffer
	must(Write(&out, "example.com/skiff:test", Config{Env: []string{"PATH=/usr/bin"}, WorkingDir: "/"}, t.TempDir(),
		Layer{Comment: "base", Dir: root},
		Layer{Comment: "binaries", Files: map[string]string{"/usr/local/bin/sandboxd": bin}}))

	hdrs, data := entries(t, &out)
	var manifest []struct {
		Config   string
		RepoTags []string
		Layers   []string
	}
	must(json.Unmarshal(data["manifest.json"], &manifest))
	if len(manifest) != 1 || len(manifest[0].Layers) != 2 || manifest[0].RepoTags[0] != "example.com/skiff:test" {
		t.Fatalf("manifest: %+v", manifest)
	}
	var config struct {
		OS     string
		Config struct{ Env []string }
		Rootfs struct {
			DiffIDs []string `json:"diff_ids"`
		}
	}
	cfgData := data[manifest[0].Config]
	sum := sha256.Sum256(cfgData)
	if manifest[0].Config != hex.EncodeToString(sum[:])+".json" {
		t.Errorf("config %s is not named by its digest", manifest[0].Config)
	}
	must(json.Unmarshal(cfgData, &config))
	if config.OS != "linux" || len(config.Rootfs.DiffIDs) != 2 || config.Config.Env[0] != "PATH=/usr/bin" {
		t.Fatalf("config: %s", cfgData)
	}
	layers := make([]map[string]*tar.Header, 2)
	contents := make([]map[string][]byte, 2)
	for i, name := range manifest[0].Layers {
		sum := sha256.Sum256(data[name])
		if "sha256:"+hex.EncodeToString(sum[:]) != config.Rootfs.DiffIDs[i] || !strings.HasPrefix(name, hex.EncodeToString(sum[:])) {
			t.Errorf("layer %d (%s): digest %x, diff_id %s", i, name, sum, config.Rootfs.DiffIDs[i])
		}
		if hdrs[name].Size != int64(len(data[name])) {
			t.Errorf("layer %s: size", name)
		}
		layers[i], contents[i] = entries(t, bytes.NewReader(data[name]))
	}
	base := layers[0]
	if h := base["usr/bin/tool"]; h == nil || h.Mode&0o777 != 0o755 || string(contents[0]["usr/bin/tool"]) != "#!/bin/sh\n" {
		t.Errorf("usr/bin/tool: %+v", h)
	}
	if h := base["usr/bin/tool2"]; h == nil || h.Typeflag != tar.TypeLink || h.Linkname != "usr/bin/tool" {
		t.Errorf("the hard link usr/bin/tool2: %+v", h)
	}
	if h := base["bin"]; h == nil || h.Typeflag != tar.TypeSymlink || h.Linkname != "usr/bin" {
		t.Errorf("the symlink bin: %+v", h)
	}
	if h := base["etc/"]; h == nil || h.Typeflag != tar.TypeDir {
		t.Errorf("etc/: %+v", h)
	}
	top := layers[1]
	if h := top["usr/local/bin/sandboxd"]; h == nil || h.Mode != 0o750 || h.Uid != 0 || string(contents[1]["usr/local/bin/sandboxd"]) != "\x7fELF…" {
		t.Errorf("usr/local/bin/sandboxd: %+v", h)
	}
	for _, d := range []string{"usr/", "usr/local/", "usr/local/bin/"} {
		if h := top[d]; h == nil || h.Typeflag != tar.TypeDir {
			t.Errorf("binaries layer lacks %s", d)
		}
	}
	if err := Write(io.Discard, "no-tag", Config{}, t.TempDir()); err == nil {
		t.Error("a reference without a tag was accepted")
	}
}

// TestCheckLinked: this test's own binary (static or not) loads on this
// machine's root; a dynamic one does not load in an empty root.
func TestCheckLinked(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if err := CheckLinked("/", self); err != nil {
		t.Errorf("on /: %v", err)
	}
	sh := "/bin/sh" // dynamic on Debian
	if err := CheckLinked(t.TempDir(), sh); err == nil || !strings.Contains(err.Error(), "lacks") {
		t.Errorf("%s in an empty root: %v", sh, err)
	}
}
