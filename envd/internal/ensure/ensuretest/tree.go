// Package ensuretest builds the file tree that envd's tests use to show what
// a request acting as an unprivileged user does: as e2b's envd, it acts as
// root, and gives what it creates or writes to the user. The tree has
// root-owned files and directories next to the user's home, and symlinks the
// user planted in that home pointing at them.
package ensuretest

import (
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/skiff-dev/skiff/envd/internal/identity"
)

// Contents of the tree's files.
const (
	SecretContent = "root's secret\n"
	PublicContent = "root's public file\n"
	SharedContent = "shared with the user's group\n"
	MineContent   = "the user's own file\n"
	HiddenContent = "in a directory the user cannot enter\n"
)

// Tree is a temporary tree; every path is absolute.
type Tree struct {
	User *identity.User // uid 1000, else nobody

	Dir     string // root:root 0755, holds everything below
	Home    string // Dir/home: the user's, 0755
	Secret  string // Dir/secret: root:root 0600
	Public  string // Dir/public: root:root 0644
	Shared  string // Dir/shared: root:<user's group> 0664, the user may write it
	RootDir string // Dir/rootdir: root:root 0755, empty; the user may not write it
	Private string // Dir/private: root:root 0700, the user may not enter it
	Hidden  string // Private/hidden: root:root 0644
	Mine    string // Home/mine.txt: the user's, 0640

	// Symlinks the user planted in Home (owned by the user).
	LinkSecret string // Home/report.txt → Secret
	LinkPublic string // Home/public.txt → Public
	LinkDir    string // Home/out → RootDir
}

// New builds a tree for the user with uid 1000 (or nobody, where no uid
// 1000 exists). It skips the test unless it runs as root.
func New(t *testing.T) *Tree {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: the tree has files of root and of another user")
	}
	name := "nobody"
	if u, err := user.LookupId("1000"); err == nil {
		name = u.Username
	}
	u, err := identity.Lookup(name)
	if err != nil {
		t.Skipf("no unprivileged user: %v", err)
	}
	dir := t.TempDir()
	// t.TempDir's parent is 0700: let the user reach the tree.
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	tr := &Tree{
		User:    u,
		Dir:     dir,
		Home:    filepath.Join(dir, "home"),
		Secret:  filepath.Join(dir, "secret"),
		Public:  filepath.Join(dir, "public"),
		Shared:  filepath.Join(dir, "shared"),
		RootDir: filepath.Join(dir, "rootdir"),
		Private: filepath.Join(dir, "private"),
	}
	tr.Hidden = filepath.Join(tr.Private, "hidden")
	tr.Mine = filepath.Join(tr.Home, "mine.txt")
	tr.LinkSecret = filepath.Join(tr.Home, "report.txt")
	tr.LinkPublic = filepath.Join(tr.Home, "public.txt")
	tr.LinkDir = filepath.Join(tr.Home, "out")

	uid, gid := int(u.UID), int(u.GID)
	mkdir(t, tr.Home, 0o755, uid, gid)
	mkdir(t, tr.RootDir, 0o755, 0, 0)
	mkdir(t, tr.Private, 0o700, 0, 0)
	file(t, tr.Secret, SecretContent, 0o600, 0, 0)
	file(t, tr.Public, PublicContent, 0o644, 0, 0)
	file(t, tr.Shared, SharedContent, 0o664, 0, gid)
	file(t, tr.Hidden, HiddenContent, 0o644, 0, 0)
	file(t, tr.Mine, MineContent, 0o640, uid, gid)
	link(t, tr.Secret, tr.LinkSecret, uid, gid)
	link(t, tr.Public, tr.LinkPublic, uid, gid)
	link(t, tr.RootDir, tr.LinkDir, uid, gid)
	return tr
}

func mkdir(t *testing.T, p string, mode fs.FileMode, uid, gid int) {
	t.Helper()
	if err := os.Mkdir(p, mode); err != nil {
		t.Fatal(err)
	}
	chown(t, p, mode, uid, gid)
}

func file(t *testing.T, p, content string, mode fs.FileMode, uid, gid int) {
	t.Helper()
	if err := os.WriteFile(p, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	chown(t, p, mode, uid, gid)
}

// chown sets owner and mode exactly (the umask would take group write).
func chown(t *testing.T, p string, mode fs.FileMode, uid, gid int) {
	t.Helper()
	if err := os.Chown(p, uid, gid); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
}

func link(t *testing.T, target, p string, uid, gid int) {
	t.Helper()
	if err := os.Symlink(target, p); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(p, uid, gid); err != nil {
		t.Fatal(err)
	}
}

// CheckFile fails the test unless p is a regular file with content, owned
// by uid:gid, with permission bits mode.
func CheckFile(t *testing.T, p, content string, uid, gid uint32, mode fs.FileMode) {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Errorf("%s: %v", p, err)
		return
	}
	st := fi.Sys().(*syscall.Stat_t)
	if !fi.Mode().IsRegular() || st.Uid != uid || st.Gid != gid || fi.Mode().Perm() != mode {
		t.Errorf("%s: %v owned by %d:%d, want a regular file %v owned by %d:%d", p, fi.Mode(), st.Uid, st.Gid, mode, uid, gid)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Errorf("%s: %v", p, err)
		return
	}
	if string(b) != content {
		t.Errorf("%s = %q, want %q", p, b, content)
	}
}

// CheckOwner fails the test unless p (not followed) is owned by uid:gid.
func CheckOwner(t *testing.T, p string, uid, gid uint32) {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Errorf("%s: %v", p, err)
		return
	}
	if st := fi.Sys().(*syscall.Stat_t); st.Uid != uid || st.Gid != gid {
		t.Errorf("%s owned by %d:%d, want %d:%d", p, st.Uid, st.Gid, uid, gid)
	}
}

// CheckUntouched fails the test if anything of root's in the tree changed:
// content, owner and mode of its files, and the root directories' entries.
func (tr *Tree) CheckUntouched(t *testing.T) {
	t.Helper()
	CheckFile(t, tr.Secret, SecretContent, 0, 0, 0o600)
	CheckFile(t, tr.Public, PublicContent, 0, 0, 0o644)
	CheckFile(t, tr.Hidden, HiddenContent, 0, 0, 0o644)
	for dir, want := range map[string]int{tr.RootDir: 0, tr.Private: 1} {
		entries, err := os.ReadDir(dir)
		if err != nil || len(entries) != want {
			t.Errorf("%s holds %d entries (%v), want %d", dir, len(entries), err, want)
		}
		CheckOwner(t, dir, 0, 0)
	}
	for p, target := range map[string]string{tr.LinkSecret: tr.Secret, tr.LinkPublic: tr.Public, tr.LinkDir: tr.RootDir} {
		if got, err := os.Readlink(p); err != nil || got != target {
			t.Errorf("link %s → %q (%v), want → %s", p, got, err, target)
		}
	}
}
