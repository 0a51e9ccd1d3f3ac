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
	"strings"
)

// Paths are the directories of the cgroup rel, given relative to this
// process's cgroups as runtimes take it, in every hierarchy: below this
// process's cgroup on cgroup v1 (and in the v2 part of a hybrid host), and
// beside it — under its parent — on a cgroup v2 host, where libcontainer and
// runsc put relative cgroups.
func Paths(rel string) ([]string, error) {
	data, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil, err
	}
	var paths []string
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
		paths = append(paths, filepath.Join(mount, own, rel))
	}
	return paths, nil
}

// Remove removes the (empty) cgroup rel from every hierarchy; one that is
// not there is not an error.
func Remove(rel string) error {
	paths, err := Paths(rel)
	if err != nil {
		return err
	}
	var errs []error
	for _, p := range paths {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove cgroup %s: %w", p, err))
		}
	}
	return errors.Join(errs...)
}
