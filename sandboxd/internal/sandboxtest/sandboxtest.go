// Package sandboxtest helps tests start real sandboxes: it builds envd,
// makes small root filesystems and network namespaces, and removes all of
// it when the test ends, whether it passed or not.
package sandboxtest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/skiff-dev/skiff/sandboxd/internal/sandboxrt"
	"github.com/skiff-dev/skiff/shared/cgroups"
)

// RequireRoot skips the test unless it runs as root, as sandboxd does.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: sandboxes are namespaces, mounts and cgroups")
	}
}

var buildEnvd = sync.OnceValues(func() (string, error) {
	if p := os.Getenv("SKIFF_ENVD"); p != "" {
		return p, nil
	}
	return buildStatic("github.com/skiff-dev/skiff/envd/cmd/envd", "envd")
})

var buildHog = sync.OnceValues(func() (string, error) {
	return buildStatic("github.com/skiff-dev/skiff/sandboxd/internal/sandboxtest/hog", "hog")
})

// buildInit builds sandboxd-init as make does, but without the commit in
// its build (go test stamps none in the test binary, with which it must
// agree: nsinit.Build).
var buildInit = sync.OnceValues(func() (string, error) {
	return buildStatic("github.com/skiff-dev/skiff/sandboxd/cmd/sandboxd-init", "sandboxd-init",
		"CGO_ENABLED=1", "-buildvcs=false", "-tags", "seccomp netgo osusergo", "-ldflags", "-linkmode external -extldflags -static")
})

// InitBinary returns the path of a sandboxd-init of the test binary's own
// build, built once per test binary.
func InitBinary(t testing.TB) string {
	t.Helper()
	p, err := buildInit()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// buildStatic builds the static binary of package pkg from the workspace
// into the test cache as name, and returns its path. With no args it is a
// pure Go build (CGO_ENABLED=0); args are, first, environment variables
// (NAME=value) and then go build's flags.
func buildStatic(pkg, name string, args ...string) (string, error) {
	dir, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	dir = filepath.Join(dir, "skiff", "test-bin")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	tmp, err := os.CreateTemp(dir, "."+name+"-*")
	if err != nil {
		return "", err
	}
	_ = tmp.Close()
	env := []string{"CGO_ENABLED=0"}
	for len(args) > 0 && strings.Contains(args[0], "=") && !strings.HasPrefix(args[0], "-") {
		env, args = append(env, args[0]), args[1:]
	}
	cmd := exec.Command("go", append(append([]string{"build", "-trimpath", "-o", tmp.Name()}, args...), pkg)...)
	cmd.Env = append(os.Environ(), env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		_ = os.Remove(tmp.Name())
		return "", fmt.Errorf("build %s: %w\n%s", name, err, out)
	}
	bin := filepath.Join(dir, name)
	return bin, os.Rename(tmp.Name(), bin)
}

// EnvdBinary returns the path of a static envd binary: $SKIFF_ENVD, or one built
// from the workspace once per test binary.
func EnvdBinary(t testing.TB) string {
	t.Helper()
	p, err := buildEnvd()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// Hog returns the path of the static hog binary (package hog), built once
// per test binary: it takes one kind of kernel resource until refused.
func Hog(t testing.TB) string {
	t.Helper()
	p, err := buildHog()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// InstallHog copies the hog binary into the root filesystem at rootfs, as
// /usr/bin/hog.
func InstallHog(t testing.TB, rootfs string) {
	t.Helper()
	data, err := os.ReadFile(Hog(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(rootfs, "usr/bin/hog"), data, 0o755); err != nil {
		t.Fatal(err)
	}
}

// hogLine is the line the hog prints for what it took.
var hogLine = regexp.MustCompile(`got=(\d+) err=(\S+)`)

// ParseHog reads the hog's line in out, "got=<n> err=<what stopped it>":
// how much it got and what stopped it; ok is false until out has it whole.
func ParseHog(out string) (n int, stopped string, ok bool) {
	m := hogLine.FindStringSubmatch(out)
	if m == nil {
		return 0, "", false
	}
	n, err := strconv.Atoi(m[1])
	return n, m[2], err == nil
}

// Dir returns a new directory that unprivileged users may search (mode
// 0711, unlike t.TempDir's 0700), as a sandbox runtime's directory must be.
// It is removed when the test ends.
func Dir(t testing.TB) string {
	t.Helper()
	d, err := os.MkdirTemp("", "skiff-test-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(d, 0o711); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.RemoveAll(d); err != nil {
			t.Errorf("remove %s: %v", d, err)
		}
	})
	return d
}

// BusyboxRootfs returns a small root filesystem: busybox (static) with sh
// and bash as links to it, a root and a `user` (uid 1000, /home/user), and
// /tmp. It needs Debian's busybox-static.
func BusyboxRootfs(t testing.TB) string {
	t.Helper()
	bb, err := exec.LookPath("busybox")
	if err != nil {
		t.Fatal("busybox not found (apt-get install busybox-static)")
	}
	root := filepath.Join(Dir(t), "rootfs")
	for _, d := range []string{"bin", "etc", "tmp", "root", "home/user", "proc", "dev", "usr/bin", "sbin"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(filepath.Join(root, "tmp"), 0o1777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(filepath.Join(root, "home/user"), 1000, 1000); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(bb)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "bin/busybox"), data, 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bb, "--list").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, applet := range strings.Fields(string(out)) {
		_ = os.Symlink("busybox", filepath.Join(root, "bin", applet))
	}
	files := map[string]string{
		// envd runs commands with /bin/bash -l -c; busybox's ash does that.
		"bin/bash":   "#!/bin/sh\nexec /bin/sh \"$@\"\n",
		"etc/passwd": "root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/bash\nnobody:x:65534:65534::/nonexistent:/bin/false\n",
		"etc/group":  "root:x:0:\ntty:x:5:\nuser:x:1000:\nnogroup:x:65534:\n",
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(root, name), []byte(content), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// Netns returns the path of a new network namespace with only loopback, up.
// It is removed when the test ends.
func Netns(t testing.TB) string {
	t.Helper()
	path := filepath.Join(Dir(t), "netns")
	errc := make(chan error, 1)
	go func() {
		// The thread ends in the new namespace; it is never unlocked, so
		// the runtime throws it away rather than reuse it.
		runtime.LockOSThread()
		errc <- func() error {
			if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
				return fmt.Errorf("unshare: %w", err)
			}
			lo, err := netlink.LinkByName("lo")
			if err != nil {
				return err
			}
			if err := netlink.LinkSetUp(lo); err != nil {
				return err
			}
			f, err := os.Create(path)
			if err != nil {
				return err
			}
			_ = f.Close()
			return unix.Mount(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()), path, "", unix.MS_BIND, "")
		}()
	}()
	if err := <-errc; err != nil {
		t.Fatalf("network namespace: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(path, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", path, err)
		}
	})
	return path
}

// InNetns runs fn on a thread inside the network namespace at path.
// Sockets fn opens stay in that namespace afterwards.
func InNetns(t testing.TB, path string, fn func()) {
	t.Helper()
	ns, err := netns.GetFromPath(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
		if err := netns.Set(ns); err != nil {
			done <- err
			return
		}
		fn()
		done <- nil
	}()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// CgroupParent returns a cgroup name, unique to the test, for a runtime to
// put its sandboxes under (relative to this process's cgroups), and removes
// it from every hierarchy when the test ends.
func CgroupParent(t testing.TB) string {
	t.Helper()
	name := filepath.Base(Dir(t))
	t.Cleanup(func() {
		// A sandbox's last process may still be a zombie for a moment when
		// its reaper is the host's init (a sandbox adopted after a restart
		// of sandboxd); its cgroup empties once it is reaped.
		deadline := time.Now().Add(10 * time.Second)
		for {
			err := cgroups.Remove(name)
			if err == nil {
				return
			}
			if !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
				t.Error(err)
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
	return name
}

// Swap gives the host a swap area of size bytes until the test ends (a
// file of its own, removed after), so that the test sees what sandboxes do
// on a host with swap. It skips the test where the host refuses one: a
// file system swap cannot be on, or no mkswap(8).
func Swap(t testing.TB, size int64) {
	t.Helper()
	RequireRoot(t)
	file := filepath.Join(Dir(t), "swap")
	f, err := os.OpenFile(file, os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	// Written, not allocated: swap takes no file with holes.
	zeros := make([]byte, 1<<20)
	for n := int64(0); n < size && err == nil; n += int64(len(zeros)) {
		_, err = f.Write(zeros)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mkswap", file).CombinedOutput(); err != nil {
		t.Skipf("mkswap: %v: %s", err, out)
	}
	if out, err := exec.Command("swapon", file).CombinedOutput(); err != nil {
		t.Skipf("swapon %s: %v: %s", file, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("swapoff", file).CombinedOutput(); err != nil {
			t.Errorf("swapoff %s: %v: %s", file, err, out)
		}
	})
}

// Mount2 makes sandboxrt mount overlays by mount(2), as on a kernel
// before 6.8, until t ends. Tests that use it must not run in parallel.
func Mount2(t testing.TB) {
	plus := sandboxrt.LowerdirPlus
	sandboxrt.LowerdirPlus = func() bool { return false }
	t.Cleanup(func() { sandboxrt.LowerdirPlus = plus })
}

// Layers makes n snapshot layers (package layer's format: owned as inside
// the sandbox), topmost first, as a sandbox snapshotted or paused to its
// files n times stacks them: layer i has /layer<i> and /top reading i, so
// a sandbox on them sees every layer's file and the topmost /top. Their
// paths are long, as a host's state directory makes them.
func Layers(t testing.TB, n int) []string {
	t.Helper()
	dir := filepath.Join(Dir(t), "var-lib-skiff-sandboxd", "snapshots", "layers")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	layers := make([]string, n)
	for i := range n {
		l := filepath.Join(dir, fmt.Sprintf("layer-%040d", i))
		if err := os.Mkdir(l, 0o755); err != nil {
			t.Fatal(err)
		}
		for name, content := range map[string]string{fmt.Sprintf("layer%d", i): "", "top": fmt.Sprint(i)} {
			if err := os.WriteFile(filepath.Join(l, name), []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		layers[i] = l
	}
	return layers
}
