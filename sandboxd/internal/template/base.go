package template

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/skiff-dev/skiff/shared/mountinfo"
)

// BaseName is the name of the built-in template, the one the e2b SDKs start
// when they name none.
const BaseName = "base"

// baseRecipe versions what BuildBase does to a root filesystem besides
// debootstrap's own work. Bump it when the post-processing changes so cached
// root filesystems are built again.
const baseRecipe = "3"

// BasePackages are the packages the base template adds to debootstrap's
// minbase variant (which already has bash and coreutils; they are listed
// because the template promises them): what e2b's base template offers
// and the SDKs' examples use, python as well as python3, pip, and sudo,
// which lets user become root without a password, as in e2b's template.
// That is no more than the API gives (it runs commands as root): root in a
// sandbox is root of its user namespace only.
var BasePackages = []string{"bash", "coreutils", "python3", "python-is-python3", "python3-pip", "ca-certificates", "curl", "git", "procps", "sudo"}

// The account the e2b SDKs run commands as.
const (
	baseUser  = "user"
	baseUID   = 1000
	baseGID   = 1000
	baseHome  = "/home/user"
	baseShell = "/bin/bash"
)

// FallbackMirror is the mirror BuildBase uses when the host's apt sources
// name no Debian archive.
const FallbackMirror = "http://deb.debian.org/debian"

// BaseOptions says how to build the base template. The zero value builds
// Debian bookworm from the host's mirror into the default cache.
type BaseOptions struct {
	// Suite is the Debian release (default "bookworm").
	Suite string
	// Mirror is the Debian archive to build from (default:
	// DefaultMirror(Suite)).
	Mirror string
	// Arch is the Debian architecture (default: the host's).
	Arch string
	// CacheDir holds downloaded packages and finished root filesystems
	// (default: DefaultCacheDir).
	CacheDir string
	// Packages are installed on top of the minbase variant (default:
	// BasePackages).
	Packages []string
	// Debootstrap is the debootstrap program (default: looked up in PATH,
	// then in /usr/sbin and /sbin).
	Debootstrap string
	// Progress receives debootstrap's output and BuildBase's steps (default:
	// discarded).
	Progress io.Writer
}

// BaseRootfs is a built (or cached) base root filesystem.
type BaseRootfs struct {
	// Dir is the finished root filesystem in the cache. Treat it as
	// read-only: later builds with the same options reuse it.
	Dir string
	// Key names the options Dir was built from.
	Key string
	// Cached is whether Dir came from the cache rather than a fresh build.
	Cached bool
}

// BuildBase builds the base template's root filesystem in the library and
// makes it the current version of template "base". Because a version is the
// digest of the content, building again from the cache changes nothing.
func (l *Library) BuildBase(ctx context.Context, opts BaseOptions) (*Template, error) {
	r, err := BuildBase(ctx, opts)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(progressOf(opts), "importing %s as template %s\n", r.Dir, BaseName)
	return l.ImportDir(BaseName, r.Dir)
}

// BuildBase prepares the base root filesystem with debootstrap: Debian
// (minbase) with opts.Packages, an unprivileged account "user" (uid and gid
// 1000, home /home/user, shell /bin/bash, passwordless sudo when the
// packages have sudo), no apt lists or package
// caches, a neutral /etc/hostname and an empty /etc/resolv.conf.
//
// The result is cached under opts.CacheDir, keyed by the suite, mirror,
// architecture, packages and recipe: a second build with the same options
// returns the cached directory at once. Downloaded packages are kept in
// opts.CacheDir/debs for the next cold build. The cache is written
// atomically, so an interrupted build leaves nothing half-made behind, and
// concurrent builds wait for one another.
func BuildBase(ctx context.Context, opts BaseOptions) (*BaseRootfs, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	progress := progressOf(opts)
	debootstrap, err := findDebootstrap(opts.Debootstrap)
	if err != nil {
		return nil, err
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("build base template: debootstrap needs root")
	}
	key := baseCacheKey(opts)
	final := filepath.Join(opts.CacheDir, "rootfs-"+key[:16])
	if isDir(final) {
		fmt.Fprintf(progress, "using the cached root filesystem %s\n", final)
		return &BaseRootfs{Dir: final, Key: key, Cached: true}, nil
	}
	debs := filepath.Join(opts.CacheDir, "debs")
	if err := os.MkdirAll(debs, 0o755); err != nil {
		return nil, fmt.Errorf("build base template: %w", err)
	}
	unlock, err := lockDir(ctx, opts.CacheDir, progress)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if isDir(final) { // built by whoever held the lock before us
		fmt.Fprintf(progress, "using the cached root filesystem %s\n", final)
		return &BaseRootfs{Dir: final, Key: key, Cached: true}, nil
	}
	removeLeftovers(opts.CacheDir, progress)

	staging, err := os.MkdirTemp(opts.CacheDir, ".build-")
	if err != nil {
		return nil, fmt.Errorf("build base template: %w", err)
	}
	done := false
	defer func() {
		if !done {
			if err := removeBuildDir(staging); err != nil {
				fmt.Fprintf(progress, "warning: %v\n", err)
			}
		}
	}()
	if err := os.Chmod(staging, 0o755); err != nil {
		return nil, fmt.Errorf("build base template: %w", err)
	}
	fmt.Fprintf(progress, "debootstrap %s (%s) from %s with %s\n", opts.Suite, opts.Arch, opts.Mirror, strings.Join(opts.Packages, ","))
	start := time.Now()
	if err := runDebootstrap(ctx, debootstrap, opts, debs, staging); err != nil {
		return nil, err
	}
	fmt.Fprintf(progress, "debootstrap finished in %s; preparing the root filesystem\n", time.Since(start).Round(time.Second))
	if err := finishBase(staging); err != nil {
		return nil, fmt.Errorf("build base template: %w", err)
	}
	if err := os.Rename(staging, final); err != nil {
		return nil, fmt.Errorf("build base template: %w", err)
	}
	done = true
	fmt.Fprintf(progress, "cached the root filesystem at %s\n", final)
	return &BaseRootfs{Dir: final, Key: key}, nil
}

var (
	suiteRE   = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]*$`)
	packageRE = regexp.MustCompile(`^[a-z0-9][a-z0-9+.-]+$`)
	archRE    = regexp.MustCompile(`^[a-z0-9][a-z0-9-]*$`)
)

func (o BaseOptions) withDefaults() (BaseOptions, error) {
	if o.Suite == "" {
		o.Suite = "bookworm"
	}
	if !suiteRE.MatchString(o.Suite) {
		return o, fmt.Errorf("suite %q is not a Debian release name", o.Suite)
	}
	if o.Mirror == "" {
		o.Mirror = DefaultMirror(o.Suite)
	}
	o.Mirror = strings.TrimRight(o.Mirror, "/")
	if u, err := url.Parse(o.Mirror); err != nil || (u.Scheme != "http" && u.Scheme != "https" && u.Scheme != "file") || (u.Scheme != "file" && u.Host == "") {
		return o, fmt.Errorf("mirror %q: want an http, https or file URL", o.Mirror)
	}
	if o.Arch == "" {
		o.Arch = debianArch(runtime.GOARCH)
	}
	if !archRE.MatchString(o.Arch) {
		return o, fmt.Errorf("architecture %q is not a Debian architecture", o.Arch)
	}
	if o.CacheDir == "" {
		dir, err := DefaultCacheDir()
		if err != nil {
			return o, err
		}
		o.CacheDir = dir
	}
	dir, err := filepath.Abs(o.CacheDir) // debootstrap wants an absolute --cache-dir
	if err != nil {
		return o, fmt.Errorf("cache directory: %w", err)
	}
	o.CacheDir = dir
	if len(o.Packages) == 0 {
		o.Packages = BasePackages
	}
	pkgs := slices.Clone(o.Packages)
	slices.Sort(pkgs)
	o.Packages = slices.Compact(pkgs)
	for _, p := range o.Packages {
		if !packageRE.MatchString(p) {
			return o, fmt.Errorf("package %q is not a Debian package name", p)
		}
	}
	return o, nil
}

func progressOf(o BaseOptions) io.Writer {
	if o.Progress == nil {
		return io.Discard
	}
	return o.Progress
}

// DefaultCacheDir is where BuildBase caches by default:
// $XDG_CACHE_HOME/skiff/debootstrap, or ~/.cache/skiff/debootstrap.
func DefaultCacheDir() (string, error) {
	dir, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("cache directory: %w", err)
	}
	return filepath.Join(dir, "skiff", "debootstrap"), nil
}

// baseCacheKey names the root filesystem opts (with defaults applied) make.
func baseCacheKey(o BaseOptions) string {
	h := sha256.New()
	fmt.Fprintf(h, "recipe=%s\nvariant=minbase\nsuite=%s\nmirror=%s\narch=%s\npackages=%s\n",
		baseRecipe, o.Suite, o.Mirror, o.Arch, strings.Join(o.Packages, ","))
	return hex.EncodeToString(h.Sum(nil))
}

// debianArch maps a Go architecture to Debian's name for it.
func debianArch(goarch string) string {
	switch goarch {
	case "386":
		return "i386"
	case "arm":
		return "armhf"
	case "ppc64le":
		return "ppc64el"
	case "mips64le":
		return "mips64el"
	case "mipsle":
		return "mipsel"
	case "loong64":
		return "loong64"
	default: // amd64, arm64, riscv64, s390x
		return goarch
	}
}

// debootstrapDirs are searched after PATH, which often lacks the sbin
// directories for non-login shells.
var debootstrapDirs = []string{"/usr/sbin", "/sbin"}

func findDebootstrap(p string) (string, error) {
	const hint = "install it with `apt-get install debootstrap`"
	if p != "" {
		if _, err := exec.LookPath(p); err != nil {
			return "", fmt.Errorf("debootstrap %s: %w; %s", p, err, hint)
		}
		return p, nil
	}
	if p, err := exec.LookPath("debootstrap"); err == nil {
		return p, nil
	}
	for _, dir := range debootstrapDirs {
		p := filepath.Join(dir, "debootstrap")
		if _, err := exec.LookPath(p); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("building the base template needs debootstrap, which is not installed: %s", hint)
}

// runDebootstrap runs debootstrap into target in a mount namespace of its
// own, so the /proc and /sys it mounts in the target never show on the host
// and vanish with it, however it ends.
func runDebootstrap(ctx context.Context, debootstrap string, o BaseOptions, debs, target string) error {
	args := []string{
		"--variant=minbase",
		"--arch=" + o.Arch,
		"--include=" + strings.Join(o.Packages, ","),
		"--cache-dir=" + debs,
		o.Suite, target, o.Mirror,
	}
	cmd := exec.CommandContext(ctx, debootstrap, args...)
	cmd.Stdout = progressOf(o)
	cmd.Stderr = progressOf(o)
	cmd.Env = append(slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return strings.HasPrefix(kv, "PATH=") || strings.HasPrefix(kv, "LC_ALL=") || strings.HasPrefix(kv, "DEBIAN_FRONTEND=")
	}), "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C", "DEBIAN_FRONTEND=noninteractive")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Unshareflags: syscall.CLONE_NEWNS}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("debootstrap: %w", ctx.Err())
		}
		err = fmt.Errorf("debootstrap %s from %s: %w", o.Suite, o.Mirror, err)
		// The staging folder goes; keep debootstrap's log.
		if data, rerr := os.ReadFile(filepath.Join(target, "debootstrap", "debootstrap.log")); rerr == nil {
			saved := filepath.Join(o.CacheDir, "debootstrap-failed.log")
			if werr := os.WriteFile(saved, data, 0o644); werr == nil {
				err = fmt.Errorf("%w (its log is %s)", err, saved)
			}
		}
		return err
	}
	return nil
}

// lockDir holds an exclusive lock on dir until the returned function runs.
func lockDir(ctx context.Context, dir string, progress io.Writer) (func(), error) {
	f, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", dir, err)
	}
	for waited := false; ; waited = true {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", dir, err)
		}
		if !waited {
			fmt.Fprintf(progress, "waiting for another build in %s\n", dir)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
	return func() { f.Close() }, nil
}

// removeLeftovers removes the staging folders of builds that were killed
// before they could clean up. The caller holds the lock, so none is in use.
func removeLeftovers(cacheDir string, progress io.Writer) {
	entries, _ := os.ReadDir(cacheDir)
	for _, e := range entries {
		if e.IsDir() && strings.HasPrefix(e.Name(), ".build-") {
			if err := removeBuildDir(filepath.Join(cacheDir, e.Name())); err != nil {
				fmt.Fprintf(progress, "warning: %v\n", err)
			}
		}
	}
}

// removeBuildDir removes a staging folder, unless something is mounted in
// it: removing a tree with the host's /dev or /proc inside would reach out
// of it.
func removeBuildDir(dir string) error {
	mounts, err := mountinfo.Under(dir)
	if err != nil {
		return fmt.Errorf("left %s in place: %w", dir, err)
	}
	if len(mounts) > 0 {
		return fmt.Errorf("left %s in place: %s is mounted", dir, mounts[0])
	}
	return os.RemoveAll(dir)
}

func isDir(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.IsDir()
}

// finishBase turns debootstrap's output into the base template. Everything
// goes through an os.Root, so no symbolic link in the tree (an absolute
// /etc/resolv.conf link, say) can lead a write onto the host.
func finishBase(dir string) error {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	if err := addBaseUser(root, time.Now()); err != nil {
		return err
	}
	if err := makeHome(root); err != nil {
		return err
	}
	if err := allowSudo(root); err != nil {
		return err
	}
	// sandboxd writes the sandbox's own resolv.conf and hostname at start;
	// keep nothing of the build host's.
	for name, content := range map[string]string{
		"etc/resolv.conf": "",
		"etc/hostname":    "sandbox\n",
	} {
		if err := replaceFile(root, name, content, 0o644); err != nil {
			return err
		}
	}
	if _, err := root.Lstat("etc/hosts"); errors.Is(err, fs.ErrNotExist) {
		hosts := "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\nff02::1\tip6-allnodes\nff02::2\tip6-allrouters\n"
		if err := replaceFile(root, "etc/hosts", hosts, 0o644); err != nil {
			return err
		}
	}
	// pip installs packages, as in e2b's base template: Debian marks its
	// Python as managed by apt (PEP 668), and pip then refuses every
	// install. A sandbox is its own throwaway system.
	marks, err := fs.Glob(root.FS(), "usr/lib/python3*/EXTERNALLY-MANAGED")
	if err != nil {
		return err
	}
	for _, m := range marks {
		if err := root.Remove(m); err != nil {
			return err
		}
	}
	if err := root.MkdirAll("tmp", 0o777); err != nil {
		return err
	}
	if err := root.Chmod("tmp", 0o777|fs.ModeSticky); err != nil {
		return err
	}
	return shrink(root)
}

// sudoersFile lets user run anything as anyone, without a password, as in
// e2b's template; it is written when the packages brought sudo.
const (
	sudoersFile  = "etc/sudoers.d/" + baseUser
	sudoersEntry = baseUser + " ALL=(ALL:ALL) NOPASSWD: ALL\n"
)

func allowSudo(root *os.Root) error {
	if _, err := root.Stat("usr/bin/sudo"); errors.Is(err, fs.ErrNotExist) {
		return nil
	} else if err != nil {
		return err
	}
	if err := root.MkdirAll("etc/sudoers.d", 0o755); err != nil {
		return err
	}
	return replaceFile(root, sudoersFile, sudoersEntry, 0o440)
}

// replaceFile makes name a regular file holding content, replacing whatever
// (a symbolic link included) was there.
func replaceFile(root *os.Root, name, content string, mode fs.FileMode) error {
	if err := root.Remove(name); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err := root.WriteFile(name, []byte(content), mode); err != nil {
		return err
	}
	return root.Chmod(name, mode)
}

// addBaseUser adds the account "user" to the account databases.
func addBaseUser(root *os.Root, now time.Time) error {
	uid, gid := strconv.Itoa(baseUID), strconv.Itoa(baseGID)
	days := strconv.FormatInt(now.Unix()/86400, 10)
	edits := []struct {
		file, line string
		idField    int // the field that must be unique too, or -1
		optional   bool
	}{
		{"etc/passwd", fmt.Sprintf("%s:x:%s:%s::%s:%s", baseUser, uid, gid, baseHome, baseShell), 2, false},
		{"etc/group", fmt.Sprintf("%s:x:%s:", baseUser, gid), 2, false},
		{"etc/shadow", fmt.Sprintf("%s:!:%s:0:99999:7:::", baseUser, days), -1, false},
		{"etc/gshadow", baseUser + ":!::", -1, true},
	}
	for _, e := range edits {
		data, err := root.ReadFile(e.file)
		if errors.Is(err, fs.ErrNotExist) && e.optional {
			continue
		}
		if err != nil {
			return err
		}
		out, err := addEntry(data, e.line, e.idField)
		if err != nil {
			return fmt.Errorf("%s: %w", e.file, err)
		}
		if !bytes.Equal(out, data) {
			// WriteFile on the existing file keeps its mode and owner
			// (/etc/shadow stays 0640 root:shadow).
			if err := root.WriteFile(e.file, out, 0o644); err != nil {
				return err
			}
		}
	}
	return nil
}

// addEntry adds line to a colon-separated account database (passwd, group,
// shadow, gshadow). An entry of the same name is kept when its field idField
// (when idField >= 0) matches line's, and is an error otherwise; another
// entry with line's id is an error too.
func addEntry(data []byte, line string, idField int) ([]byte, error) {
	want := strings.Split(line, ":")
	name := want[0]
	for l := range strings.Lines(string(data)) {
		f := strings.Split(strings.TrimRight(l, "\n"), ":")
		if len(f) == 0 || f[0] == "" || strings.HasPrefix(f[0], "#") {
			continue
		}
		sameID := idField >= 0 && len(f) > idField && f[idField] == want[idField]
		switch {
		case f[0] == name && (idField < 0 || sameID):
			return data, nil
		case f[0] == name:
			return nil, fmt.Errorf("%s already exists with id %s, want %s", name, f[idField], want[idField])
		case sameID:
			return nil, fmt.Errorf("id %s already belongs to %s", want[idField], f[0])
		}
	}
	out := slices.Clone(data)
	if len(out) > 0 && out[len(out)-1] != '\n' {
		out = append(out, '\n')
	}
	return append(append(out, line...), '\n'), nil
}

// makeHome creates the user's home with /etc/skel's files in it.
func makeHome(root *os.Root) error {
	home := strings.TrimPrefix(baseHome, "/")
	if err := root.MkdirAll(home, 0o755); err != nil {
		return err
	}
	if err := root.Chmod(home, 0o755); err != nil {
		return err
	}
	if err := root.Lchown(home, baseUID, baseGID); err != nil {
		return err
	}
	if _, err := root.Stat("etc/skel"); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return fs.WalkDir(root.FS(), "etc/skel", func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == "etc/skel" {
			return err
		}
		target := path.Join(home, strings.TrimPrefix(p, "etc/skel/"))
		fi, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			if err := root.Mkdir(target, fi.Mode().Perm()); err != nil && !errors.Is(err, fs.ErrExist) {
				return err
			}
		case fi.Mode().IsRegular():
			data, err := root.ReadFile(p)
			if err != nil {
				return err
			}
			if err := root.WriteFile(target, data, fi.Mode().Perm()); err != nil {
				return err
			}
		default:
			return nil // skel holds no links or devices worth copying
		}
		return root.Lchown(target, baseUID, baseGID)
	})
}

// shrink removes what apt downloaded: the package lists (run `apt-get
// update` in a sandbox before installing) and the package caches.
func shrink(root *os.Root) error {
	for _, dir := range []struct {
		path string
		drop func(name string) bool
	}{
		{"var/lib/apt/lists", func(n string) bool { return n != "partial" && n != "lock" && n != "auxfiles" }},
		{"var/cache/apt", func(n string) bool { return strings.HasSuffix(n, ".bin") }},
		{"var/cache/apt/archives", func(n string) bool { return strings.HasSuffix(n, ".deb") }},
		{"var/cache/apt/archives/partial", func(string) bool { return true }},
	} {
		entries, err := fs.ReadDir(root.FS(), dir.path)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		for _, e := range entries {
			if dir.drop(e.Name()) && !e.IsDir() {
				if err := root.Remove(path.Join(dir.path, e.Name())); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// DefaultMirror picks the Debian archive to build suite from out of the
// host's apt sources (/etc/apt/sources.list, then sources.list.d in order):
// the first that serves suite, else the first whose path names debian (a
// Debian host of another release), else FallbackMirror (a host of another
// distribution).
func DefaultMirror(suite string) string {
	return mirrorFromAptDir("/etc/apt", suite)
}

// aptSource is one archive of the host's apt sources.
type aptSource struct {
	URI    string
	Suites []string
}

func mirrorFromAptDir(dir, suite string) string {
	files := []string{filepath.Join(dir, "sources.list")}
	parts, _ := filepath.Glob(filepath.Join(dir, "sources.list.d", "*"))
	slices.Sort(parts)
	files = append(files, parts...)
	var all []aptSource
	for _, f := range files {
		if !strings.HasSuffix(f, ".list") && !strings.HasSuffix(f, ".sources") {
			continue
		}
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		if strings.HasSuffix(f, ".list") {
			all = append(all, mirrorsFromList(data)...)
		} else {
			all = append(all, mirrorsFromSources(data)...)
		}
	}
	for _, s := range all {
		if slices.Contains(s.Suites, suite) {
			return s.URI
		}
	}
	for _, s := range all {
		if u, err := url.Parse(s.URI); err == nil && strings.Contains(u.Path, "debian") {
			return s.URI
		}
	}
	return FallbackMirror
}

// mirrorsFromList returns the Debian archives of a one-line-style
// sources.list, in order.
func mirrorsFromList(data []byte) []aptSource {
	var out []aptSource
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line, _, _ := strings.Cut(sc.Text(), "#")
		f := strings.Fields(line)
		if len(f) < 3 || f[0] != "deb" {
			continue
		}
		f = f[1:]
		if strings.HasPrefix(f[0], "[") { // [ option=value … ]
			for len(f) > 0 && !strings.HasSuffix(f[0], "]") {
				f = f[1:]
			}
			if len(f) > 0 {
				f = f[1:]
			}
		}
		if len(f) >= 2 && isArchive(f[0], f[1:2]) {
			out = append(out, aptSource{URI: strings.TrimRight(f[0], "/"), Suites: f[1:2]})
		}
	}
	return out
}

// mirrorsFromSources returns the Debian archives of a deb822-style .sources
// file, in order.
func mirrorsFromSources(data []byte) []aptSource {
	var out []aptSource
	for _, stanza := range parseDeb822(data) {
		if strings.EqualFold(stanza["enabled"], "no") || !slices.Contains(strings.Fields(stanza["types"]), "deb") {
			continue
		}
		suites := strings.Fields(stanza["suites"])
		for _, uri := range strings.Fields(stanza["uris"]) {
			if isArchive(uri, suites) {
				out = append(out, aptSource{URI: strings.TrimRight(uri, "/"), Suites: suites})
			}
		}
	}
	return out
}

// parseDeb822 splits deb822 data into stanzas of lower-cased field names to
// values (continuation lines joined with spaces).
func parseDeb822(data []byte) []map[string]string {
	var out []map[string]string
	cur, last := map[string]string{}, ""
	flush := func() {
		if len(cur) > 0 {
			out = append(out, cur)
		}
		cur, last = map[string]string{}, ""
	}
	for l := range strings.Lines(string(data)) {
		l = strings.TrimRight(l, "\r\n")
		switch {
		case strings.TrimSpace(l) == "":
			flush()
		case strings.HasPrefix(l, "#"):
		case l[0] == ' ' || l[0] == '\t':
			if last != "" {
				cur[last] += " " + strings.TrimSpace(l)
			}
		default:
			k, v, ok := strings.Cut(l, ":")
			if !ok {
				continue
			}
			last = strings.ToLower(strings.TrimSpace(k))
			cur[last] = strings.TrimSpace(v)
		}
	}
	flush()
	return out
}

// isArchive tells whether uri serving suites is a Debian archive debootstrap
// can build from: an http, https or file URL, and not the security archive.
func isArchive(uri string, suites []string) bool {
	u, err := url.Parse(uri)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https" && u.Scheme != "file") {
		return false
	}
	if strings.Contains(u.Path, "security") {
		return false
	}
	for _, s := range suites {
		if !strings.HasSuffix(s, "-security") && !strings.HasSuffix(s, "/updates") {
			return true
		}
	}
	return false
}
