package template

import (
	"bytes"
	"context"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/skiff-dev/skiff/shared/mountinfo"
)

func TestAddEntry(t *testing.T) {
	passwd := "root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin"
	line := "user:x:1000:1000::/home/user:/bin/bash"
	out, err := addEntry([]byte(passwd), line, 2)
	if err != nil || string(out) != passwd+"\n"+line+"\n" {
		t.Fatalf("addEntry = %q, %v", out, err)
	}
	if again, err := addEntry(out, line, 2); err != nil || !bytes.Equal(again, out) {
		t.Fatalf("adding again = %q, %v; want no change", again, err)
	}
	if _, err := addEntry([]byte("user:x:1001:1001::/home/user:/bin/sh\n"), line, 2); err == nil {
		t.Error("a user with another uid was accepted")
	}
	if _, err := addEntry([]byte("debian:x:1000:1000::/home/debian:/bin/bash\n"), line, 2); err == nil {
		t.Error("a second account with uid 1000 was accepted")
	}
	if out, err := addEntry(nil, "user:!::", -1); err != nil || string(out) != "user:!::\n" {
		t.Errorf("addEntry to an empty file = %q, %v", out, err)
	}
	shadow := "root:*:19000:0:99999:7:::\nuser:!:1:0:99999:7:::\n"
	if out, err := addEntry([]byte(shadow), "user:!:2:0:99999:7:::", -1); err != nil || string(out) != shadow {
		t.Errorf("shadow re-add = %q, %v; want no change", out, err)
	}
}

func TestMirrors(t *testing.T) {
	list := `# deb cdrom:[Debian GNU/Linux 12]/ bookworm main
deb cdrom:[Debian]/ bookworm main
deb-src http://src.example/debian bookworm main
deb http://security.debian.org/debian-security bookworm-security main
deb [ arch=amd64 signed-by=/usr/share/keyrings/x.gpg ] https://mirror.example/debian/ bookworm main contrib # the mirror
deb [trusted=yes] http://other.example/debian trixie main
`
	uris := func(ss []aptSource) []string {
		var out []string
		for _, s := range ss {
			out = append(out, s.URI+" "+strings.Join(s.Suites, ","))
		}
		return out
	}
	if got := uris(mirrorsFromList([]byte(list))); !slices.Equal(got, []string{"https://mirror.example/debian bookworm", "http://other.example/debian trixie"}) {
		t.Errorf("mirrorsFromList = %q", got)
	}
	sources := `# Debian's default
Types: deb deb-src
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main

Types: deb
Enabled: no
URIs: http://disabled.example/debian
Suites: bookworm

types: deb
uris:
 http://a.example/debian/
 http://b.example/debian
suites: trixie
`
	want := []string{"http://deb.debian.org/debian bookworm,bookworm-updates", "http://a.example/debian trixie", "http://b.example/debian trixie"}
	if got := uris(mirrorsFromSources([]byte(sources))); !slices.Equal(got, want) {
		t.Errorf("mirrorsFromSources = %q, want %q", got, want)
	}

	etc := t.TempDir()
	write := func(name, data string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(filepath.Join(etc, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(etc, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		file, data, suite, want string
	}{
		{"", "", "bookworm", FallbackMirror},
		// A deb822 file; the archive serving the suite wins.
		{"sources.list.d/debian.sources", sources, "bookworm", "http://deb.debian.org/debian"},
		{"", "", "trixie", "http://a.example/debian"},
		// No archive serves the suite: the first Debian one.
		{"", "", "sid", "http://deb.debian.org/debian"},
		// sources.list comes first, as it does for apt.
		{"sources.list", list, "bookworm", "https://mirror.example/debian"},
		{"", "", "trixie", "http://other.example/debian"},
		// Another distribution's archives are never picked.
		{"sources.list", "deb http://archive.ubuntu.com/ubuntu noble main\n", "bookworm", "http://deb.debian.org/debian"},
	} {
		if c.file != "" {
			write(c.file, c.data)
		}
		if got := mirrorFromAptDir(etc, c.suite); got != c.want {
			t.Errorf("after %s, mirror for %s = %q, want %q", c.file, c.suite, got, c.want)
		}
	}
	if err := os.RemoveAll(filepath.Join(etc, "sources.list.d")); err != nil {
		t.Fatal(err)
	}
	if got := mirrorFromAptDir(etc, "bookworm"); got != FallbackMirror {
		t.Errorf("an Ubuntu host: mirror = %q, want %q", got, FallbackMirror)
	}
}

func TestBaseOptions(t *testing.T) {
	t.Setenv("XDG_CACHE_HOME", "/cache")
	o, err := BaseOptions{Mirror: "http://m.example/debian/"}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if o.Suite != "bookworm" || o.Mirror != "http://m.example/debian" || o.CacheDir != "/cache/skiff/debootstrap" || !slices.IsSorted(o.Packages) || !slices.Contains(o.Packages, "python3") || o.Arch == "" {
		t.Errorf("defaults = %+v", o)
	}
	key := baseCacheKey(o)
	same, _ := BaseOptions{Mirror: "http://m.example/debian", Packages: []string{"procps", "sudo", "python3-pip", "git", "curl", "ca-certificates", "python3", "python-is-python3", "coreutils", "bash", "git"}}.withDefaults()
	if baseCacheKey(same) != key {
		t.Error("the key depends on the packages' order or a mirror's trailing slash")
	}
	for _, other := range []BaseOptions{
		{Mirror: "http://m.example/debian", Suite: "trixie"},
		{Mirror: "http://n.example/debian"},
		{Mirror: "http://m.example/debian", Arch: "arm64"},
		{Mirror: "http://m.example/debian", Packages: []string{"bash"}},
	} {
		o, err := other.withDefaults()
		if err != nil || baseCacheKey(o) == key {
			t.Errorf("%+v: key %v, %v; want another key", other, baseCacheKey(o), err)
		}
	}
	for _, bad := range []BaseOptions{
		{Suite: "../x"}, {Mirror: "ftp://m.example/debian"}, {Mirror: "http://"},
		{Packages: []string{"bash", "--foo"}}, {Arch: "x y"},
	} {
		if _, err := bad.withDefaults(); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
	if _, err := BuildBase(t.Context(), BaseOptions{Debootstrap: "/nonexistent/debootstrap", CacheDir: t.TempDir()}); err == nil || !strings.Contains(err.Error(), "apt-get install debootstrap") {
		t.Errorf("missing debootstrap: %v; want a hint at the package", err)
	}
	old := debootstrapDirs
	t.Cleanup(func() { debootstrapDirs = old })
	debootstrapDirs = nil
	t.Setenv("PATH", t.TempDir())
	if _, err := findDebootstrap(""); err == nil || !strings.Contains(err.Error(), "apt-get install debootstrap") {
		t.Errorf("debootstrap not in PATH: %v", err)
	}
}

// fakeDebootstrap writes a debootstrap that makes a tiny root filesystem
// and counts its runs in <dir>/runs; with fail set it fails half-way.
func fakeDebootstrap(t *testing.T, fail bool) (prog, runs string) {
	t.Helper()
	dir := t.TempDir()
	runs = filepath.Join(dir, "runs")
	exit := "exit 0"
	if fail {
		exit = "echo 'E: Couldn'\"'\"'t download packages' >&2; exit 1"
	}
	script := `#!/bin/sh
set -e
echo "$@" >> ` + runs + `
eval "target=\${$(($# - 1))}"
cd "$target"
mkdir -p etc/skel/.config home tmp bin var/lib/apt/lists/partial var/cache/apt/archives/partial
mkdir -p debootstrap && echo 'dpkg: error processing package' > debootstrap/debootstrap.log
printf 'root:x:0:0:root:/root:/bin/bash\n' > etc/passwd
printf 'root:x:0:\nsudo:x:27:\n' > etc/group
printf 'root:*:19000:0:99999:7:::\n' > etc/shadow
chmod 640 etc/shadow
printf 'root:*::\n' > etc/gshadow
printf '# bashrc\n' > etc/skel/.bashrc
printf 'x\n' > etc/skel/.config/x
mkdir -p usr/lib/python3.11 && printf '[externally-managed]\n' > usr/lib/python3.11/EXTERNALLY-MANAGED
printf '#!/bin/sh\n' > bin/bash
mkdir -p usr/bin && printf '#!/bin/sh\n' > usr/bin/sudo && chmod 4755 usr/bin/sudo
chmod 700 tmp
ln -s /run/systemd/resolve/stub-resolv.conf etc/resolv.conf
echo buildhost > etc/hostname
touch var/lib/apt/lists/deb.debian.org_debian_dists_bookworm_InRelease var/lib/apt/lists/lock
touch var/cache/apt/pkgcache.bin var/cache/apt/archives/bash_5.2_amd64.deb var/cache/apt/archives/lock
echo "I: Base system installed successfully."
` + exit + "\n"
	prog = filepath.Join(dir, "debootstrap")
	if err := os.WriteFile(prog, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return prog, runs
}

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("building the base template needs root")
	}
}

func TestBuildBaseFake(t *testing.T) {
	needRoot(t)
	cache := t.TempDir()
	prog, runs := fakeDebootstrap(t, false)
	var progress bytes.Buffer
	opts := BaseOptions{CacheDir: cache, Mirror: "http://m.example/debian", Debootstrap: prog, Progress: &progress}
	r, err := BuildBase(t.Context(), opts)
	if err != nil {
		t.Fatalf("BuildBase: %v\n%s", err, progress.String())
	}
	if r.Cached || filepath.Dir(r.Dir) != cache {
		t.Errorf("first build = %+v", r)
	}
	args, _ := os.ReadFile(runs)
	for _, want := range []string{"--variant=minbase", "--cache-dir=" + cache + "/debs", "--include=bash,ca-certificates,coreutils,curl,git,procps,python-is-python3,python3,python3-pip,sudo", " bookworm ", " http://m.example/debian"} {
		if !strings.Contains(string(args), want) {
			t.Errorf("debootstrap ran with %q, want %q in it", args, want)
		}
	}
	checkFile := func(name, want string) {
		t.Helper()
		got, err := os.ReadFile(filepath.Join(r.Dir, name))
		if err != nil || string(got) != want {
			t.Errorf("%s = %q, %v; want %q", name, got, err, want)
		}
	}
	checkFile("etc/passwd", "root:x:0:0:root:/root:/bin/bash\nuser:x:1000:1000::/home/user:/bin/bash\n")
	checkFile("etc/group", "root:x:0:\nsudo:x:27:\nuser:x:1000:\n")
	checkFile("etc/gshadow", "root:*::\nuser:!::\n")
	checkFile("etc/resolv.conf", "")
	checkFile("etc/hostname", "sandbox\n")
	checkFile("etc/sudoers.d/user", "user ALL=(ALL:ALL) NOPASSWD: ALL\n")
	if st, err := os.Stat(filepath.Join(r.Dir, "etc/sudoers.d/user")); err != nil || st.Mode().Perm() != 0o440 {
		t.Errorf("etc/sudoers.d/user: %v, %v; sudo reads only a 0440 file", st, err)
	}
	if _, err := os.Stat(filepath.Join(r.Dir, "usr/lib/python3.11/EXTERNALLY-MANAGED")); !os.IsNotExist(err) {
		t.Errorf("Debian's PEP 668 marker is left, so pip would refuse installs: %v", err)
	}
	checkFile("home/user/.bashrc", "# bashrc\n")
	checkFile("home/user/.config/x", "x\n")
	if shadow, _ := os.ReadFile(filepath.Join(r.Dir, "etc/shadow")); !strings.Contains(string(shadow), "\nuser:!:") {
		t.Errorf("shadow = %q", shadow)
	}
	if fi, err := os.Stat(filepath.Join(r.Dir, "etc/shadow")); err != nil || fi.Mode().Perm() != 0o640 {
		t.Errorf("shadow's mode changed: %v, %v", fi, err)
	}
	if _, err := os.Stat("/run/systemd/resolve/stub-resolv.conf"); err == nil {
		if b, _ := os.ReadFile("/run/systemd/resolve/stub-resolv.conf"); len(b) == 0 {
			t.Error("the host's resolv.conf was emptied")
		}
	}
	for _, name := range []string{"home/user", "home/user/.bashrc", "home/user/.config"} {
		fi, err := os.Stat(filepath.Join(r.Dir, name))
		if st, ok := fi.Sys().(*syscall.Stat_t); err != nil || !ok || st.Uid != 1000 || st.Gid != 1000 {
			t.Errorf("%s is not owned by 1000:1000: %v", name, err)
		}
	}
	if fi, err := os.Stat(filepath.Join(r.Dir, "tmp")); err != nil || fi.Mode()&os.ModeSticky == 0 || fi.Mode().Perm() != 0o777 {
		t.Errorf("tmp = %v, %v; want 1777", fi, err)
	}
	for _, gone := range []string{"var/lib/apt/lists/deb.debian.org_debian_dists_bookworm_InRelease", "var/cache/apt/pkgcache.bin", "var/cache/apt/archives/bash_5.2_amd64.deb"} {
		if _, err := os.Lstat(filepath.Join(r.Dir, gone)); err == nil {
			t.Errorf("%s was kept", gone)
		}
	}
	for _, kept := range []string{"var/lib/apt/lists/partial", "var/lib/apt/lists/lock", "var/cache/apt/archives/partial"} {
		if _, err := os.Lstat(filepath.Join(r.Dir, kept)); err != nil {
			t.Errorf("%s was removed", kept)
		}
	}

	// The second build comes from the cache without running debootstrap.
	again, err := BuildBase(t.Context(), opts)
	if err != nil || !again.Cached || again.Dir != r.Dir || again.Key != r.Key {
		t.Errorf("second build = %+v, %v", again, err)
	}
	if args2, _ := os.ReadFile(runs); !bytes.Equal(args2, args) {
		t.Error("the second build ran debootstrap")
	}

	// The library imports it as "base", and again without a new version.
	lib, err := OpenLibrary(filepath.Join(t.TempDir(), "templates"))
	if err != nil {
		t.Fatal(err)
	}
	a, err := lib.BuildBase(t.Context(), opts)
	if err != nil || a.Name != BaseName {
		t.Fatalf("Library.BuildBase = %+v, %v", a, err)
	}
	b, err := lib.BuildBase(t.Context(), opts)
	if err != nil || b.Version != a.Version {
		t.Fatalf("rebuild = %+v, %v; want version %s", b, err, a.Version)
	}

	// A failed build caches nothing and leaves no staging folder.
	failing, _ := fakeDebootstrap(t, true)
	cache2 := t.TempDir()
	progress.Reset()
	_, err = BuildBase(t.Context(), BaseOptions{CacheDir: cache2, Debootstrap: failing, Progress: &progress})
	if err == nil || !strings.Contains(err.Error(), "debootstrap-failed.log") {
		t.Fatalf("a failing debootstrap: %v; want its log named", err)
	}
	if log, _ := os.ReadFile(filepath.Join(cache2, "debootstrap-failed.log")); !strings.Contains(string(log), "dpkg: error") {
		t.Errorf("saved log = %q", log)
	}
	if !strings.Contains(progress.String(), "Couldn't download") {
		t.Errorf("debootstrap's output was not passed on: %q", progress.String())
	}
	entries, _ := os.ReadDir(cache2)
	for _, e := range entries {
		if e.Name() != "debs" && e.Name() != ".lock" && e.Name() != "debootstrap-failed.log" {
			t.Errorf("a failed build left %s", e.Name())
		}
	}
	// A leftover of a killed build is removed by the next one.
	if err := os.MkdirAll(filepath.Join(cache2, ".build-123/etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := BuildBase(t.Context(), BaseOptions{CacheDir: cache2, Debootstrap: prog}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(cache2, ".build-123")); err == nil {
		t.Error("the leftover staging folder was kept")
	}
}

func TestBuildBaseCancel(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	prog := filepath.Join(dir, "debootstrap")
	// A debootstrap whose child outlives it unless its process group is
	// killed.
	if err := os.WriteFile(prog, []byte("#!/bin/sh\nsleep 60 &\necho $! > "+dir+"/child\nwait\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	cache := t.TempDir()
	start := time.Now()
	_, err := BuildBase(ctx, BaseOptions{CacheDir: cache, Debootstrap: prog})
	if err == nil || time.Since(start) > 8*time.Second {
		t.Fatalf("cancelled build = %v after %s", err, time.Since(start))
	}
	// The group got SIGKILL; the child dies when the kernel delivers it,
	// which may be a moment after the build returned.
	if pid, _ := os.ReadFile(filepath.Join(dir, "child")); len(pid) > 0 {
		proc := "/proc/" + strings.TrimSpace(string(pid))
		deadline := time.Now().Add(5 * time.Second)
		for {
			stat, err := os.ReadFile(proc + "/stat")
			if err != nil || strings.Contains(string(stat), ") Z ") {
				break // gone, or dead and waiting to be reaped
			}
			if time.Now().After(deadline) {
				t.Errorf("debootstrap's child %s survived the cancel: %s", pid, stat)
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	if entries, _ := os.ReadDir(cache); len(entries) != 2 {
		t.Errorf("a cancelled build left %v", entries)
	}
}

// TestBuildBase builds the real base template with debootstrap, in the
// shared default cache so that only the first run on a host is slow.
func TestBuildBase(t *testing.T) {
	needRoot(t)
	if _, err := findDebootstrap(""); err != nil {
		t.Skip(err)
	}
	if testing.Short() {
		t.Skip("builds a Debian root filesystem")
	}
	lib, err := OpenLibrary(filepath.Join(t.TempDir(), "templates"))
	if err != nil {
		t.Fatal(err)
	}
	var progress bytes.Buffer
	start := time.Now()
	tpl, err := lib.BuildBase(t.Context(), BaseOptions{Progress: &progress})
	if err != nil {
		t.Fatalf("BuildBase: %v\n%s", err, progress.String())
	}
	t.Logf("first build: %s", time.Since(start).Round(time.Millisecond))
	root := tpl.Rootfs
	for _, p := range []string{"bin/bash", "usr/bin/bash", "usr/bin/python3", "usr/bin/curl", "usr/bin/git", "usr/bin/ls", "etc/ssl/certs/ca-certificates.crt", "home/user/.bashrc", "home/user/.profile"} {
		if _, err := os.Stat(filepath.Join(root, p)); err != nil {
			t.Errorf("missing %s: %v", p, err)
		}
	}
	if st, err := os.Stat(filepath.Join(root, "usr/bin/sudo")); err != nil || st.Mode()&fs.ModeSetuid == 0 {
		t.Errorf("usr/bin/sudo: %v, %v; want it setuid", st, err)
	}
	if got, err := os.ReadFile(filepath.Join(root, "etc/sudoers.d/user")); err != nil || string(got) != "user ALL=(ALL:ALL) NOPASSWD: ALL\n" {
		t.Errorf("etc/sudoers.d/user = %q, %v", got, err)
	}
	passwd, _ := os.ReadFile(filepath.Join(root, "etc/passwd"))
	if !strings.Contains(string(passwd), "\nuser:x:1000:1000::/home/user:/bin/bash\n") {
		t.Errorf("passwd has no user 1000:\n%s", passwd)
	}
	group, _ := os.ReadFile(filepath.Join(root, "etc/group"))
	for l := range strings.Lines(string(group)) {
		if f := strings.Split(strings.TrimSpace(l), ":"); len(f) == 4 && slices.Contains(strings.Split(f[3], ","), "user") {
			t.Errorf("user is a member of %s", f[0])
		}
	}
	if list, err := lib.List(); err != nil || len(list) != 1 || list[0].Name != "base" || list[0].Version != tpl.Version {
		t.Errorf("List = %+v, %v", list, err)
	}

	// The SDKs run everything through `/bin/bash -l -c` as user. The
	// runtime gives a sandbox its /dev; here a private mount namespace gets
	// a tmpfs with /dev/null (git needs it), gone when the command ends.
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	script := `mount -t tmpfs -o mode=755 dev "$1/dev" && mknod -m 666 "$1/dev/null" c 1 3 && ` +
		`exec chroot --userspec=1000:1000 "$1" /bin/bash -l -c "$2"`
	sdk := `echo "$(id -un) $HOME"; python3 -c 'print(6*7)'; echo "$(git --version | cut -d' ' -f1) $(curl --version | head -1 | cut -d' ' -f1)"`
	cmd := exec.CommandContext(ctx, "/bin/sh", "-c", script, "sh", root, sdk)
	cmd.Env = []string{"HOME=/home/user", "USER=user", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil || string(out) != "user /home/user\n42\ngit curl\n" || stderr.Len() > 0 {
		t.Errorf("bash -l as user = %q, %v; stderr %q", out, err, stderr.String())
	}
	if mounts, _ := mountinfo.Under(root); len(mounts) > 0 {
		t.Errorf("mounts left behind: %q", mounts)
	}

	progress.Reset()
	start = time.Now()
	again, err := lib.BuildBase(t.Context(), BaseOptions{Progress: &progress})
	took := time.Since(start)
	t.Logf("second build: %s", took.Round(time.Millisecond))
	if err != nil || again.Version != tpl.Version {
		t.Fatalf("second build = %+v, %v; want version %s", again, err, tpl.Version)
	}
	if !strings.Contains(progress.String(), "using the cached root filesystem") || took > 45*time.Second {
		t.Errorf("second build took %s and said %q; want it from the cache", took, progress.String())
	}
}
