package network

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// onNSThread runs fn on a new goroutine locked to its OS thread, after enter
// has moved that thread to another network namespace, and waits for it. fn
// gets the thread's original namespace. The thread goes back to it
// afterwards; if it cannot, the goroutine exits still locked, and the Go
// runtime ends the thread rather than run other goroutines in the wrong
// namespace.
func onNSThread(enter func() error, fn func(orig netns.NsHandle) error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("open current network namespace: %w", err)
			return
		}
		defer orig.Close()
		if err := enter(); err != nil {
			// unshare and setns leave the thread as it was when they fail.
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("enter network namespace: %w", err)
			return
		}
		err = fn(orig)
		if rerr := netns.Set(orig); rerr != nil {
			errc <- errors.Join(err, fmt.Errorf("return to network namespace: %w", rerr))
			return
		}
		runtime.UnlockOSThread()
		errc <- err
	}()
	return <-errc
}

// enterPath is an enter for onNSThread: it joins the namespace pinned at
// path.
func enterPath(path string) func() error {
	return func() error {
		fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open %s: %w", path, err)
		}
		defer unix.Close(fd)
		return unix.Setns(fd, unix.CLONE_NEWNET)
	}
}

// makeShared makes dir a mount point with shared propagation, as `ip netns`
// does with /run/netns: a namespace unmounted there is then also unmounted
// in mount namespaces that copied it (created while it was mounted), instead
// of being kept alive by them.
func makeShared(dir string) error {
	err := unix.Mount("", dir, "", unix.MS_SHARED|unix.MS_REC, "")
	if !errors.Is(err, unix.EINVAL) {
		return err
	}
	// Not a mount point yet.
	if err := unix.Mount(dir, dir, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return err
	}
	return unix.Mount("", dir, "", unix.MS_SHARED|unix.MS_REC, "")
}

// removeNS unmounts and removes a namespace file; one that is not there (or
// not mounted) is not an error.
func removeNS(path string) error {
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// writeSysctl sets /proc/sys/<name> in the calling thread's network
// namespace (the files under /proc/sys/net are those of the namespace of
// the thread that opens them). IPv6 settings are skipped on a kernel
// without IPv6.
func writeSysctl(name, value string) error {
	path := filepath.Join("/proc/sys", name)
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if errors.Is(err, os.ErrNotExist) && strings.HasPrefix(name, "net/ipv6/") {
		return nil
	}
	if err != nil {
		return fmt.Errorf("set sysctl %s: %w", name, err)
	}
	_, err = f.WriteString(value)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("set sysctl %s=%q: %w", name, value, err)
	}
	return nil
}

// enableForwarding sets net.ipv4.ip_forward=1 unless it already is.
func enableForwarding() error {
	const name = "net/ipv4/ip_forward"
	cur, err := os.ReadFile(filepath.Join("/proc/sys", name))
	if err != nil {
		return fmt.Errorf("read sysctl %s: %w", name, err)
	}
	if len(cur) > 0 && cur[0] == '1' {
		return nil
	}
	return writeSysctl(name, "1")
}

type sysctl struct{ name, value string }

// setUpNamespace sets sysctls in the calling thread's network namespace,
// brings up its lo, and returns a netlink handle in it, for the caller to
// close.
func setUpNamespace(sysctls []sysctl) (*netlink.Handle, error) {
	for _, s := range sysctls {
		if err := writeSysctl(s.name, s.value); err != nil {
			return nil, err
		}
	}
	in, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("open netlink: %w", err)
	}
	// lo always has index 1 in a namespace.
	if err := in.LinkSetUp(&netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: 1}}); err != nil {
		in.Close()
		return nil, fmt.Errorf("bring up lo: %w", err)
	}
	return in, nil
}
