package fleetbench

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// logWriter sends progress lines to the test's log.
type logWriter struct{ t *testing.T }

func (w logWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// Three simulated hosts against a real kube-apiserver and etcd and the
// real sandbox-apiserver and sandbox-envd-proxy: the apiserver lists every
// sandbox, the phases measure, and a dead host leaves the e2b list, the
// kubectl list and the proxy's routing within the freshness contract's
// bounds (2 s interval, 6 s window).
func TestRunSmallFleet(t *testing.T) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" || os.Getenv("SKIFF_BIN") == "" {
		t.Skip("needs KUBEBUILDER_ASSETS (make kube-bins) and SKIFF_BIN (make build), as make test sets them")
	}
	o := NewOptions()
	o.Hosts, o.SandboxesPerHost, o.Teams = 3, 30, 2
	o.Interval, o.Steady, o.Churn, o.Creates = 2*time.Second, 3*time.Second, 0.05, 3
	o.LogDir = t.TempDir()
	o.Timeout = 3 * time.Minute
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	rep, err := Run(t, o, logWriter{t})
	if err != nil {
		t.Fatal(err)
	}
	get := func(phase, metric, component string) float64 {
		t.Helper()
		v, ok := rep.Get(phase, metric, component)
		if !ok {
			t.Fatalf("no %s %s of %s", phase, metric, component)
		}
		return v
	}
	if v := get(PhaseSetup, "inventory_entry_bytes", ""); v < 150 || v > 300 {
		t.Errorf("an inventory entry is %.0f bytes, want about 200", v)
	}
	for _, phase := range []string{PhaseSteady, PhaseChurn} {
		if v := get(phase, "inventory_applies", "hosts"); v <= 0 {
			t.Errorf("%s: %g applies/s", phase, v)
		}
		if v := get(phase, "etcd_wal_write", "etcd"); v <= 0 {
			t.Errorf("%s: etcd wrote %g B/s to its WAL", phase, v)
		}
		for _, probe := range []string{"e2b_list_page", "kubectl_list_page", "proxy_lookup"} {
			component := "sandbox-apiserver"
			if probe == "proxy_lookup" {
				component = "sandbox-envd-proxy"
			}
			if n, failed := get(phase, probe+"_count", component), get(phase, probe+"_failures", component); n == 0 || failed > 0 {
				t.Errorf("%s: %s: %g answers, %g failures (%s)", phase, probe, n, failed, strings.Join(rep.notes, "; "))
			}
		}
	}
	if n, failed := get(PhaseChurn, "create_count", "sandbox-apiserver"), get(PhaseChurn, "create_failures", "sandbox-apiserver"); n != 3 || failed > 0 {
		t.Errorf("churn: %g creates, %g failures, want 3 and 0", n, failed)
	}
	// Stamps have whole seconds: measured from one, the window is reached
	// at the earliest, and the lists follow within a second of the
	// interval after it.
	lo, hi := o.window(), o.window()+o.Interval+2*time.Second
	for _, m := range []string{"e2b_list_left", "kubectl_list_left", "proxy_left"} {
		left := time.Duration(get(PhaseDeath, m+"_after_last_publish", "sim-002") * float64(time.Second))
		if left < lo || left > hi {
			t.Errorf("%s %s after the dead host's last publish, want %s to %s", m, left.Round(time.Millisecond), lo, hi)
		}
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		mut  func(*Options)
		want string // "" for valid
	}{
		{"defaults", func(*Options) {}, ""},
		{"one host", func(o *Options) { o.Hosts = 1 }, "--hosts"},
		{"fewer sandboxes than teams", func(o *Options) { o.SandboxesPerHost = 5; o.Teams = 6 }, "--sandboxes-per-host"},
		{"too many sandboxes", func(o *Options) { o.SandboxesPerHost = 5000 }, "--sandboxes-per-host"},
		{"interval under a second", func(o *Options) { o.Interval = 500 * time.Millisecond }, "--interval"},
		{"window under two intervals", func(o *Options) { o.Window = o.Interval }, "--window"},
		{"no steady", func(o *Options) { o.Steady = 0 }, "--steady"},
		{"churn above 1", func(o *Options) { o.Churn = 2 }, "--churn"},
		{"no creates", func(o *Options) { o.Creates = 0 }, "--creates"},
		{"no binaries", func(o *Options) { o.Bin = t.TempDir() }, "--bin"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := NewOptions()
			o.Bin = fakeBins(t)
			tc.mut(o)
			err := o.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("Validate: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("Validate: %v, want an error naming %s", err, tc.want)
			}
		})
	}
}

// fakeBins is a folder with empty sandbox-apiserver and sandbox-envd-proxy.
func fakeBins(t *testing.T) string {
	dir := t.TempDir()
	for _, b := range []string{"sandbox-apiserver", "sandbox-envd-proxy"} {
		if err := os.WriteFile(filepath.Join(dir, b), nil, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestSamples(t *testing.T) {
	page := `# HELP etcd_disk_wal_write_bytes_total Total number of bytes written in WAL.
# TYPE etcd_disk_wal_write_bytes_total gauge
etcd_disk_wal_write_bytes_total 1.234e+06
etcd_mvcc_put_total 42
etcd_debugging_x{a="b c",d="}"} 7
etcd_debugging_x{a="e"} 3
etcd_mvcc_put_total_other 1
`
	got := samples(page, "etcd_disk_wal_write_bytes_total", "etcd_mvcc_put_total", "etcd_debugging_x", "absent")
	want := map[string]float64{"etcd_disk_wal_write_bytes_total": 1.234e6, "etcd_mvcc_put_total": 42, "etcd_debugging_x": 10}
	if len(got) != len(want) {
		t.Errorf("samples = %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %g, want %g", k, got[k], v)
		}
	}
}

func TestPercentile(t *testing.T) {
	var ds []time.Duration
	for i := 1; i <= 100; i++ {
		ds = append(ds, time.Duration(i)*time.Millisecond)
	}
	for _, tc := range []struct {
		p    float64
		want time.Duration
	}{{50, 50 * time.Millisecond}, {99, 99 * time.Millisecond}, {100, 100 * time.Millisecond}, {0, time.Millisecond}} {
		if got := percentile(ds, tc.p); got != tc.want {
			t.Errorf("p%g = %s, want %s", tc.p, got, tc.want)
		}
	}
	if got := percentile(nil, 50); got != 0 {
		t.Errorf("p50 of none = %s", got)
	}
}

// pidOf finds this test binary by one of its arguments.
func TestPidOf(t *testing.T) {
	if len(os.Args) < 2 {
		t.Skip("the test binary has no arguments")
	}
	pid, err := pidOf(filepath.Base(os.Args[0]), os.Args[1])
	if err != nil || pid != os.Getpid() {
		t.Errorf("pidOf = %d, %v, want %d", pid, err, os.Getpid())
	}
	if _, err := pidOf("no-such-program", "x"); err == nil {
		t.Error("pidOf found a program that does not run")
	}
}
