package kubetest

import (
	"bytes"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
)

// EtcdURL is etcd's client URL (plain HTTP on loopback). etcd serves its
// Prometheus metrics there too, at /metrics, so that a benchmark can read
// what etcd itself counts (etcd_disk_wal_write_bytes_total, …).
func (e *Env) EtcdURL() *url.URL {
	u := *e.env.ControlPlane.Etcd.URL
	return &u
}

// PIDs returns the process IDs of this Env's etcd and kube-apiserver, for
// measuring what they use (/proc/<pid>/stat, status, smaps_rollup). Each
// is found by its program's name and a folder of this Env's own on its
// command line (etcd's data, the kube-apiserver's certificates); through
// the setpriv wrappers the PID is the program's, as they exec it.
func (e *Env) PIDs() (etcd, apiserver int, err error) {
	etcds := findProcesses("etcd", filepath.Join(e.WorkDir, "etcd"))
	apis := findProcesses("kube-apiserver", filepath.Join(e.WorkDir, "certs"))
	if len(etcds) != 1 || len(apis) != 1 {
		return 0, 0, fmt.Errorf("kubetest: %d etcd and %d kube-apiserver processes of %s, want one each", len(etcds), len(apis), e.WorkDir)
	}
	return etcds[0], apis[0], nil
}

// findProcesses returns the PIDs of the processes running program name
// (the base name of their argv[0]) with an argument that contains marker.
func findProcesses(name string, marker string) []int {
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	var out []int
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		args := bytes.Split(bytes.TrimRight(b, "\x00"), []byte{0})
		if len(args) < 2 || filepath.Base(string(args[0])) != name {
			continue
		}
		for _, a := range args[1:] {
			if bytes.Contains(a, []byte(marker)) {
				if pid, err := strconv.Atoi(filepath.Base(filepath.Dir(p))); err == nil {
					out = append(out, pid)
				}
				break
			}
		}
	}
	return out
}
