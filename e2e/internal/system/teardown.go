package system

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/skiff-dev/skiff/shared/cgroups"
	"github.com/skiff-dev/skiff/shared/mountinfo"
)

// endSandboxes does what sandboxd could not, for a Disposable system whose
// sandboxd is stopped: it ends every process in the sandboxes' cgroups and
// removes those cgroups, so that Stop can unmount what they held and remove
// the rest.
func (s *System) endSandboxes() error {
	var errs []error
	if s.cfg.CgroupParent != "" {
		paths, err := cgroups.Paths(s.cfg.CgroupParent)
		if err != nil {
			errs = append(errs, err)
		}
		for _, p := range paths {
			errs = append(errs, killCgroupTree(p, 10*time.Second), removeCgroupChildren(p))
		}
	}
	return errors.Join(errs...)
}

// killCgroupTree sends SIGKILL to every process in the cgroup at dir and
// below, until none is left or within passes: through cgroup.kill where
// there is one (cgroup v2, Linux 5.14), which cannot hit a process that
// left meanwhile and whose pid was reused, else by pid. A frozen cgroup (a
// paused sandbox) is thawed first: on cgroup v1 a frozen process does not
// die.
func killCgroupTree(dir string, within time.Duration) error {
	_ = os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0)
	deadline := time.Now().Add(within)
	for {
		pids, err := cgroupTreePIDs(dir)
		if err != nil || len(pids) == 0 {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("processes %v of cgroup %s outlived SIGKILL for %s", pids, dir, within)
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// cgroupTreePIDs lists the processes of the cgroup at dir and below; none
// when dir is not there. It thaws each frozen cgroup it passes.
func cgroupTreePIDs(dir string) ([]int, error) {
	var pids []int
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil || !d.IsDir() {
			return err
		}
		_ = os.WriteFile(filepath.Join(path, "cgroup.freeze"), []byte("0"), 0)      // v2
		_ = os.WriteFile(filepath.Join(path, "freezer.state"), []byte("THAWED"), 0) // v1
		data, err := os.ReadFile(filepath.Join(path, "cgroup.procs"))
		if errors.Is(err, fs.ErrNotExist) {
			return nil // removed meanwhile
		}
		if err != nil {
			return err
		}
		for f := range strings.FieldsSeq(string(data)) {
			if pid, err := strconv.Atoi(f); err == nil {
				pids = append(pids, pid)
			}
		}
		return nil
	})
	return pids, err
}

// removeCgroupChildren removes the (empty) cgroups below dir, deepest
// first; dir itself stays, for cgroups.Remove.
func removeCgroupChildren(dir string) error {
	var dirs []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err == nil && d.IsDir() && path != dir {
			dirs = append(dirs, path)
		}
		return err
	})
	var errs []error
	for _, d := range slices.Backward(dirs) { // WalkDir lists parents first
		if err := os.Remove(d); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove cgroup %s: %w", d, err))
		}
	}
	return errors.Join(err, errors.Join(errs...))
}

// unmountUnder detaches every mount at or below dir in this process's
// mount namespace, deepest first.
func unmountUnder(dir string) error {
	if dir == "" {
		return nil // not this system's
	}
	under, err := mountinfo.Under(dir)
	if err != nil {
		return err
	}
	// Deeper mounts first, and of one mount point the last mount first.
	slices.Reverse(under)
	slices.SortStableFunc(under, func(a, b string) int { return strings.Count(b, "/") - strings.Count(a, "/") })
	var errs []error
	for _, m := range under {
		if err := syscall.Unmount(m, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", m, err))
		}
	}
	return errors.Join(errs...)
}

// mountTmpfs makes dir, searchable by others (sandboxes reach their start's
// fifo through it), and mounts a tmpfs there unless one is there already.
func mountTmpfs(dir string) error {
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return fmt.Errorf("make run dir: %w", err)
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return fmt.Errorf("run dir: %w", err)
	}
	const tmpfsMagic = 0x01021994
	if st.Type == tmpfsMagic {
		return nil
	}
	if err := syscall.Mount("tmpfs", dir, "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV, "mode=0711"); err != nil {
		return fmt.Errorf("mount a tmpfs on the run dir %s: %w", dir, err)
	}
	return nil
}
