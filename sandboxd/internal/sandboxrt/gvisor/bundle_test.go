package gvisor

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestFilesTarPutsFilesUnderTheTemplatesDirectories(t *testing.T) {
	rootfs := t.TempDir()
	if err := os.MkdirAll(filepath.Join(rootfs, "etc"), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(rootfs, 0o711); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../run/resolv.conf", filepath.Join(rootfs, "etc/resolv.conf")); err != nil {
		t.Fatal(err)
	}
	data, err := filesTar(rootfs, map[string][]byte{
		"/etc/resolv.conf":   []byte("nameserver 192.0.2.1\n"),
		"etc/hosts":          []byte("127.0.0.1 localhost\n"),
		"/opt/skiff/../x/y/": []byte("y"),
	})
	if err != nil {
		t.Fatal(err)
	}
	type entry struct {
		name    string
		typ     byte
		mode    int64
		content string
	}
	var got []entry
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		content, _ := io.ReadAll(tr)
		if hdr.Uid != os.Getuid() && hdr.Typeflag == tar.TypeDir && hdr.Name != "./opt/" {
			t.Errorf("%s: uid %d", hdr.Name, hdr.Uid)
		}
		got = append(got, entry{hdr.Name, hdr.Typeflag, hdr.Mode, string(content)})
	}
	want := []entry{
		{"./", tar.TypeDir, 0o711, ""},
		{"./etc/", tar.TypeDir, 0o750, ""},
		{"./opt/", tar.TypeDir, 0o755, ""},
		{"./opt/x/", tar.TypeDir, 0o755, ""},
		{"./etc/hosts", tar.TypeReg, 0o644, "127.0.0.1 localhost\n"},
		{"./etc/resolv.conf", tar.TypeReg, 0o644, "nameserver 192.0.2.1\n"},
		{"./opt/x/y", tar.TypeReg, 0o644, "y"},
	}
	if !slices.Equal(got, want) {
		t.Errorf("tar:\n got %v\nwant %v", got, want)
	}
}

func TestFilesTarRefusesAFileThatIsADirectory(t *testing.T) {
	_, err := filesTar(t.TempDir(), map[string][]byte{"/etc": nil, "/etc/hosts": nil})
	if err == nil {
		t.Error("a file and a directory at /etc")
	}
	if _, err := filesTar(t.TempDir(), map[string][]byte{"/": nil}); err == nil {
		t.Error("a file at /")
	}
	if _, err := filesTar(t.TempDir(), map[string][]byte{"/etc/hosts": nil, "etc/hosts": nil}); err == nil {
		t.Error("one file twice")
	}
}

func TestValidID(t *testing.T) {
	for id, want := range map[string]bool{
		"abc": true, "A-b_c+d.e": true, "x": true, strings.Repeat("a", 128): true,
		"": false, ".hidden": false, "a/b": false, "a b": false, "ü": false, strings.Repeat("a", 129): false, "../x": false,
	} {
		if got := validID(id); got != want {
			t.Errorf("validID(%q) = %v, want %v", id, got, want)
		}
	}
}
