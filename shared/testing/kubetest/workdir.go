package kubetest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// A control plane keeps everything it writes (etcd's data, certificates,
// wrappers) in one work folder named workDirPrefix+random, holding ownerFile
// with the test binary's PID. The folder is removed when the test ends; one
// left behind by a test binary that died without cleaning up (a -timeout
// panic, a kill) is removed by the next Start that finds its owner gone.
const (
	workDirPrefix = "skiff-kubetest-"
	ownerFile     = "owner.pid"
)

// newWorkDir sweeps the work folders of dead test binaries and makes a new one
// with the layout Start uses, removed when the test ends.
func newWorkDir(t testing.TB) string {
	sweepOrphans(os.TempDir())
	dir, err := os.MkdirTemp("", workDirPrefix)
	if err != nil {
		t.Fatalf("kubetest: %v", err)
	}
	t.Cleanup(func() {
		if err := os.RemoveAll(dir); err != nil {
			t.Errorf("kubetest: remove %s: %v", dir, err)
		}
	})
	for _, sub := range []string{"bin", "etcd", "certs", "webhook"} {
		if err := os.Mkdir(filepath.Join(dir, sub), 0o700); err != nil {
			t.Fatalf("kubetest: %v", err)
		}
	}
	// Written last: a folder without an owner is never swept.
	if err := os.WriteFile(filepath.Join(dir, ownerFile), []byte(strconv.Itoa(os.Getpid())), 0o600); err != nil {
		t.Fatalf("kubetest: %v", err)
	}
	return dir
}

// sweepOrphans removes the work folders in tmp whose owning process is gone.
func sweepOrphans(tmp string) {
	dirs, _ := filepath.Glob(filepath.Join(tmp, workDirPrefix+"*"))
	for _, dir := range dirs {
		data, err := os.ReadFile(filepath.Join(dir, ownerFile))
		if err != nil {
			continue // being made, or not a work folder
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
		if err != nil || pid <= 0 || pid == os.Getpid() {
			continue
		}
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			_ = os.RemoveAll(dir) // best effort: another sweeper may race us
		}
	}
}

// orphanProof returns the paths to start etcd and kube-apiserver from:
// wrappers, written into bin, that start the binaries in assets with a
// parent-death signal (util-linux's setpriv), so that they die with the test
// binary even when it cannot run its cleanups (a `go test -timeout` panic, a
// kill). Without setpriv it returns the binaries themselves.
func orphanProof(t testing.TB, assets, bin string) (etcd, apiserver string) {
	etcd, apiserver = filepath.Join(assets, "etcd"), filepath.Join(assets, "kube-apiserver")
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Logf("kubetest: no setpriv; etcd and kube-apiserver outlive a test binary that is killed")
		return etcd, apiserver
	}
	wrap := func(target string) string {
		wrapper := filepath.Join(bin, filepath.Base(target))
		script := fmt.Sprintf("#!/bin/sh\nexec %q --pdeathsig KILL -- %q \"$@\"\n", setpriv, target)
		if err := os.WriteFile(wrapper, []byte(script), 0o700); err != nil {
			t.Fatalf("kubetest: %v", err)
		}
		return wrapper
	}
	return wrap(etcd), wrap(apiserver)
}
