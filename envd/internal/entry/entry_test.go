package entry

import (
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/skiff-dev/skiff/envd/proto/filesystem"
)

// xattrsSupported reports whether dir's filesystem takes user xattrs.
func xattrsSupported(t *testing.T, dir string) bool {
	t.Helper()
	p := filepath.Join(dir, ".xattr-probe")
	if err := os.WriteFile(p, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(p)
	err := unix.Lsetxattr(p, "user.probe", []byte("x"), 0)
	return err == nil
}

func TestInfo(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file.txt")
	if err := os.WriteFile(file, []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}
	exe := filepath.Join(dir, "run.sh")
	if err := os.WriteFile(exe, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(exe, 0o755); err != nil { // undo the umask
		t.Fatal(err)
	}
	sub := filepath.Join(dir, "sub")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	relLink := filepath.Join(dir, "rel-link")
	if err := os.Symlink("file.txt", relLink); err != nil {
		t.Fatal(err)
	}
	absLink := filepath.Join(sub, "abs-link")
	if err := os.Symlink(file, absLink); err != nil {
		t.Fatal(err)
	}
	dangling := filepath.Join(dir, "dangling")
	if err := os.Symlink("../nowhere", dangling); err != nil {
		t.Fatal(err)
	}
	chain := filepath.Join(dir, "chain") // → rel-link → file.txt
	if err := os.Symlink("rel-link", chain); err != nil {
		t.Fatal(err)
	}
	dirLink := filepath.Join(dir, "dir-link")
	if err := os.Symlink("sub", dirLink); err != nil {
		t.Fatal(err)
	}
	loop := filepath.Join(dir, "loop")
	if err := os.Symlink("loop", loop); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "fifo")
	if err := unix.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	fifoLink := filepath.Join(dir, "fifo-link")
	if err := os.Symlink("fifo", fifoLink); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if err := os.Chmod(sock, 0o755); err != nil {
		t.Fatal(err)
	}
	// The targets as the kernel resolves them (t.TempDir may lie under a
	// link).
	realFile, err := filepath.EvalSymlinks(file)
	if err != nil {
		t.Fatal(err)
	}
	realSub, err := filepath.EvalSymlinks(sub)
	if err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name     string
		path     string
		typ      filesystem.FileType
		size     int64 // -1: don't check; -2: the link's own (lstat)
		mode     uint32
		perms    string
		target   string // "" → no symlink target
		baseName string
	}{
		{"file", file, filesystem.FileType_FILE_TYPE_FILE, 5, 0o644, "-rw-r--r--", "", "file.txt"},
		{"executable", exe, filesystem.FileType_FILE_TYPE_FILE, 10, 0o755, "-rwxr-xr-x", "", "run.sh"},
		{"dir", sub, filesystem.FileType_FILE_TYPE_DIRECTORY, -1, 0o755, "drwxr-xr-x", "", "sub"},
		// A link is what it leads to, as e2b's envd reports it: the target's
		// type and mode, and the target fully resolved; its size is its own.
		{"relative symlink", relLink, filesystem.FileType_FILE_TYPE_FILE, -2, 0o644, "Lrwxrwxrwx", realFile, "rel-link"},
		{"absolute symlink", absLink, filesystem.FileType_FILE_TYPE_FILE, -2, 0o644, "Lrwxrwxrwx", realFile, "abs-link"},
		{"chain of symlinks", chain, filesystem.FileType_FILE_TYPE_FILE, -2, 0o644, "Lrwxrwxrwx", realFile, "chain"},
		{"symlink to a directory", dirLink, filesystem.FileType_FILE_TYPE_DIRECTORY, -1, 0o755, "Lrwxrwxrwx", realSub, "dir-link"},
		// What is neither a file nor a directory has no type.
		// A broken link's target is its own path, as e2b's envd gives it.
		{"dangling symlink", dangling, filesystem.FileType_FILE_TYPE_UNSPECIFIED, -2, 0, "Lrwxrwxrwx", dangling, "dangling"},
		{"symlink loop", loop, filesystem.FileType_FILE_TYPE_UNSPECIFIED, -1, 0, "Lrwxrwxrwx", loop, "loop"},
		{"fifo", fifo, filesystem.FileType_FILE_TYPE_UNSPECIFIED, 0, 0o644, "prw-r--r--", "", "fifo"},
		{"symlink to a fifo", fifoLink, filesystem.FileType_FILE_TYPE_UNSPECIFIED, -2, 0o644, "Lrwxrwxrwx", filepath.Join(filepath.Dir(realFile), "fifo"), "fifo-link"},
		{"socket", sock, filesystem.FileType_FILE_TYPE_UNSPECIFIED, -1, 0o755, "Srwxr-xr-x", "", "sock"},
		{"device", "/dev/null", filesystem.FileType_FILE_TYPE_UNSPECIFIED, 0, 0o666, "Dcrw-rw-rw-", "", "null"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, err := Info(tt.path)
			if err != nil {
				t.Fatalf("Info: %v", err)
			}
			if e.GetName() != tt.baseName || e.GetPath() != tt.path || e.GetType() != tt.typ {
				t.Errorf("name/path/type = %q %q %v, want %q %q %v", e.GetName(), e.GetPath(), e.GetType(), tt.baseName, tt.path, tt.typ)
			}
			want := tt.size
			if want == -2 {
				fi, err := os.Lstat(tt.path)
				if err != nil {
					t.Fatal(err)
				}
				want = fi.Size()
			}
			if want >= 0 && e.GetSize() != want {
				t.Errorf("size = %d, want %d", e.GetSize(), want)
			}
			if e.GetMode() != tt.mode {
				t.Errorf("mode = %o, want %o", e.GetMode(), tt.mode)
			}
			if e.GetPermissions() != tt.perms {
				t.Errorf("permissions = %q, want %q", e.GetPermissions(), tt.perms)
			}
			if tt.target == "" && e.SymlinkTarget != nil {
				t.Errorf("symlink target = %q, want none", e.GetSymlinkTarget())
			}
			if tt.target != "" && e.GetSymlinkTarget() != tt.target {
				t.Errorf("symlink target = %q, want %q", e.GetSymlinkTarget(), tt.target)
			}
			if e.GetOwner() == "" || e.GetGroup() == "" {
				t.Errorf("owner/group empty: %q %q", e.GetOwner(), e.GetGroup())
			}
			if d := time.Since(e.GetModifiedTime().AsTime()); tt.path != "/dev/null" && (d < 0 || d > time.Minute) {
				t.Errorf("modified time %v is not recent", e.GetModifiedTime().AsTime())
			}
		})
	}

	t.Run("owner of root-owned file", func(t *testing.T) {
		e, err := Info("/")
		if err != nil {
			t.Fatal(err)
		}
		if e.GetOwner() != "root" || e.GetGroup() != "root" {
			t.Errorf("owner/group of / = %q/%q, want root/root", e.GetOwner(), e.GetGroup())
		}
	})

	t.Run("missing", func(t *testing.T) {
		_, err := Info(filepath.Join(dir, "missing"))
		if !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("err = %v, want fs.ErrNotExist", err)
		}
	})
}

func TestPermissions(t *testing.T) {
	tests := []struct {
		mode fs.FileMode
		want string
	}{
		// As e2b's envd reports them (Go's FileMode.String), not as ls -l.
		{0o644, "-rw-r--r--"},
		{fs.ModeDir | 0o755, "drwxr-xr-x"},
		{fs.ModeSymlink | 0o777, "Lrwxrwxrwx"},
		{fs.ModeDir | fs.ModeSticky | 0o777, "dtrwxrwxrwx"},
		{fs.ModeSetuid | 0o755, "urwxr-xr-x"},
		{fs.ModeSetuid | fs.ModeSetgid | 0o644, "ugrw-r--r--"},
		{fs.ModeNamedPipe | 0o600, "prw-------"},
		{fs.ModeSocket | 0o755, "Srwxr-xr-x"},
		{fs.ModeDevice | fs.ModeCharDevice | 0o666, "Dcrw-rw-rw-"},
		{fs.ModeDevice | 0o660, "Drw-rw----"},
	}
	for _, tt := range tests {
		if got := Permissions(tt.mode); got != tt.want {
			t.Errorf("Permissions(%v) = %q, want %q", tt.mode, got, tt.want)
		}
	}
}

func TestMetadata(t *testing.T) {
	dir := t.TempDir()
	if !xattrsSupported(t, dir) {
		t.Skipf("skipping metadata tests: the filesystem of %s does not support user xattrs", dir)
	}
	file := filepath.Join(dir, "f")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	// An unrelated user xattr must survive SetMetadata and stay out of Info.
	if err := unix.Lsetxattr(file, "user.other", []byte("keep"), 0); err != nil {
		t.Fatal(err)
	}

	steps := []struct {
		name string
		set  map[string]string
		want map[string]string // nil → no metadata
	}{
		{"set", map[string]string{"owner": "alice", "Tag": "x"}, map[string]string{"owner": "alice", "tag": "x"}},
		{"replace", map[string]string{"owner": "bob", "new": ""}, map[string]string{"owner": "bob", "new": ""}},
		{"clear", nil, nil},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			if err := SetMetadata(file, st.set); err != nil {
				t.Fatalf("SetMetadata: %v", err)
			}
			e, err := Info(file)
			if err != nil {
				t.Fatal(err)
			}
			got := e.GetMetadata()
			if len(got) != len(st.want) {
				t.Fatalf("metadata = %v, want %v", got, st.want)
			}
			for k, v := range st.want {
				if gv, ok := got[k]; !ok || gv != v {
					t.Errorf("metadata[%q] = %q,%v want %q", k, gv, ok, v)
				}
			}
			buf := make([]byte, 16)
			n, err := unix.Lgetxattr(file, "user.other", buf)
			if err != nil || string(buf[:n]) != "keep" {
				t.Errorf("user.other = %q, %v; want kept", buf[:n], err)
			}
		})
	}

	t.Run("through a link", func(t *testing.T) {
		if err := SetMetadata(file, map[string]string{"k": "v"}); err != nil {
			t.Fatal(err)
		}
		link := filepath.Join(dir, "link")
		if err := os.Symlink(file, link); err != nil {
			t.Fatal(err)
		}
		e, err := Info(link)
		if err != nil {
			t.Fatal(err)
		}
		if md := e.GetMetadata(); len(md) != 1 || md["k"] != "v" {
			t.Fatalf("metadata of a link = %v, want its target's", md)
		}
	})

	t.Run("missing path", func(t *testing.T) {
		err := SetMetadata(filepath.Join(dir, "missing"), map[string]string{"a": "b"})
		if !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("err = %v, want fs.ErrNotExist", err)
		}
	})
}

// A user.e2b.* attribute set inside the sandbox (setfattr) may hold any
// bytes. One whose key or value is not UTF-8 is left out of the entry, which
// then encodes (a protobuf string must be UTF-8); the others stay.
func TestMetadataNotUTF8(t *testing.T) {
	dir := t.TempDir()
	if !xattrsSupported(t, dir) {
		t.Skipf("the filesystem of %s does not support user xattrs", dir)
	}
	file := filepath.Join(dir, "f")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for name, value := range map[string]string{
		MetadataPrefix + "good":       "ok",
		MetadataPrefix + "badvalue":   "\xff\xfe",
		MetadataPrefix + "bad\xffkey": "v",
	} {
		if err := unix.Lsetxattr(file, name, []byte(value), 0); err != nil {
			t.Fatal(err)
		}
	}
	e, err := Info(file)
	if err != nil {
		t.Fatal(err)
	}
	if md := e.GetMetadata(); len(md) != 1 || md["good"] != "ok" {
		t.Fatalf("metadata = %q, want only good=ok", md)
	}
	if _, err := proto.Marshal(e); err != nil {
		t.Fatalf("proto.Marshal: %v", err)
	}
	if _, err := protojson.Marshal(e); err != nil {
		t.Fatalf("protojson.Marshal: %v", err)
	}
}

func TestSetMetadataInvalid(t *testing.T) {
	file := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	// e2b's envd's rules and messages: keys and values printable ASCII, and
	// the stored names (user.e2b. and the key) and values within 4096 bytes.
	fits := 4096 - len("user.e2b.") - len("a") // for a value under the key "a"
	tests := []struct {
		name string
		md   map[string]string
		msg  string
	}{
		{"empty key", map[string]string{"": "v"}, "invalid metadata: metadata key must not be empty"},
		{"long key", map[string]string{strings.Repeat("k", MaxKeyLen+1): "v"}, "exceeds 246 bytes"},
		{"control byte", map[string]string{"a\nb": "v"}, "invalid metadata: metadata key contains non-printable-ASCII byte 0x0a at offset 1"},
		{"non-ascii", map[string]string{"clé": "v"}, "metadata key contains non-printable-ASCII byte 0xc3 at offset 2"},
		{"non-ascii value", map[string]string{"Note": "café"}, `invalid metadata: metadata value for key "note" contains non-printable-ASCII byte 0xc3 at offset 3`},
		{"control byte in value", map[string]string{"a": "x\ty"}, `metadata value for key "a" contains non-printable-ASCII byte 0x09 at offset 1`},
		{"collision", map[string]string{"Key": "1", "key": "2"}, "collide"},
		{"too large", map[string]string{"a": strings.Repeat("v", fits+1)}, "invalid metadata: total metadata size 4097 exceeds 4096 bytes"},
		{"too large with many keys", map[string]string{"a": strings.Repeat("v", fits-len("user.e2b.b")+1), "b": ""}, "total metadata size 4097 exceeds 4096 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := SetMetadata(file, tt.md)
			if !errors.Is(err, ErrInvalidMetadata) || !strings.Contains(err.Error(), tt.msg) {
				t.Fatalf("err = %v, want ErrInvalidMetadata with %q", err, tt.msg)
			}
		})
	}
	t.Run("longest key is fine", func(t *testing.T) {
		if _, err := ValidateMetadata(map[string]string{strings.Repeat("k", MaxKeyLen): "v"}); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("largest set is fine", func(t *testing.T) {
		if _, err := ValidateMetadata(map[string]string{"a": strings.Repeat("v", fits)}); err != nil {
			t.Fatal(err)
		}
	})
}
