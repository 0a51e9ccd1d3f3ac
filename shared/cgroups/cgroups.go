// Package cgroups finds and removes the cgroups a sandbox host makes for
// its sandboxes, on cgroup v1, v2 and hybrid hosts alike. sandboxd's
// runtimes, its tests and `make up` share it, so all three agree on where
// a --cgroup-parent lives.
package cgroups

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Paths are the directories of the cgroup rel, given relative to this
// process's cgroups as runtimes take it, in every hierarchy: below this
// process's cgroup on cgroup v1 (and in the v2 part of a hybrid host), and
// beside it — under its parent — on a cgroup v2 host, where libcontainer and
// runsc put relative cgroups.
func Paths(rel string) ([]string, error) {
	hs, err := hierarchies(rel)
	if err != nil {
		return nil, err
	}
	paths := make([]string, len(hs))
	for i, h := range hs {
		paths[i] = h.path
	}
	return paths, nil
}

// ErrNoController is returned by ControllerPath when no hierarchy of this
// host has the controller.
var ErrNoController = errors.New("no cgroup hierarchy has the controller")

// ControllerPath is the directory of the cgroup rel (as Paths takes it) in
// the hierarchy of controller ("pids", "memory", …): its v1 hierarchy, or
// the unified one when that has it. On cgroup v2 the controller is enabled
// for rel's parent's children, so that rel has its files once made.
func ControllerPath(rel, controller string) (string, error) {
	hs, err := hierarchies(rel)
	if err != nil {
		return "", err
	}
	for _, h := range hs {
		if !h.unified {
			if slices.Contains(strings.Split(h.controllers, ","), controller) {
				return h.path, nil
			}
			continue
		}
		parent := filepath.Dir(h.path)
		data, err := os.ReadFile(filepath.Join(parent, "cgroup.controllers"))
		if err != nil || !slices.Contains(strings.Fields(string(data)), controller) {
			continue
		}
		if err := os.WriteFile(filepath.Join(parent, "cgroup.subtree_control"), []byte("+"+controller), 0); err != nil {
			return "", fmt.Errorf("enable the %s controller in %s: %w", controller, parent, err)
		}
		return h.path, nil
	}
	return "", fmt.Errorf("%w %s", ErrNoController, controller)
}

// hierarchy is where rel is in one line of /proc/self/cgroup.
type hierarchy struct {
	controllers string // v1: "cpu,cpuacct", "name=systemd"; "" for v2
	unified     bool
	path        string
}

func hierarchies(rel string) ([]hierarchy, error) {
	data, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil, err
	}
	var hs []hierarchy
	for line := range strings.SplitSeq(strings.TrimSpace(string(data)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		mount, own := "/sys/fs/cgroup/unified", parts[2]
		if parts[1] != "" {
			mount = "/sys/fs/cgroup/" + strings.TrimPrefix(parts[1], "name=")
		}
		if _, err := os.Stat(mount); err != nil {
			mount, own = "/sys/fs/cgroup", filepath.Dir(own)
		}
		hs = append(hs, hierarchy{controllers: parts[1], unified: parts[1] == "", path: filepath.Join(mount, own, rel)})
	}
	return hs, nil
}

// Workload is the cgroup below a sandbox's, in the pids hierarchy, that
// its workload runs in (sandboxd's native runtime on cgroup v1).
const Workload = "workload"

// Remove removes the cgroup rel, with its Workload cgroup when it has one,
// from every hierarchy; both must hold no process, and any other cgroup
// below rel keeps it. One that is not there is not an error.
func Remove(rel string) error {
	paths, err := Paths(rel)
	if err != nil {
		return err
	}
	var errs []error
	for _, p := range paths {
		for _, dir := range []string{filepath.Join(p, Workload), p} {
			if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, fmt.Errorf("remove cgroup %s: %w", dir, err))
				break
			}
		}
	}
	return errors.Join(errs...)
}

// SwapAccounted reports whether the kernel counts swap in the memory
// cgroups below rel (as Paths takes it), so that memory and swap can be
// limited together there: memory.memsw.* on cgroup v1 (a kernel booted with
// swap accounting), memory.swap.* on v2. It makes rel in the memory
// hierarchy, as a runtime does for its first sandbox: on v2 only a cgroup
// below the root has the files.
func SwapAccounted(rel string) (bool, error) {
	p, err := ControllerPath(rel, "memory")
	if err != nil {
		return false, err
	}
	if err := os.MkdirAll(p, 0o755); err != nil {
		return false, err
	}
	for _, name := range []string{"memory.memsw.limit_in_bytes", "memory.swap.max"} {
		_, err := os.Stat(filepath.Join(p, name))
		if err == nil {
			return true, nil
		}
		if !errors.Is(err, os.ErrNotExist) {
			return false, err
		}
	}
	return false, nil
}
