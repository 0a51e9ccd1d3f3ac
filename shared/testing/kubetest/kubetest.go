// Package kubetest starts a real kube-apiserver and etcd on loopback for a
// test, installs Skiff's CRDs (from api/crds) and the admission policy and
// RBAC that bind each NodeInventory to its host (from api/policies), and
// stops everything when the test ends, whether it passed, failed or
// panicked.
//
// The binaries come from KUBEBUILDER_ASSETS, or else from the cache folder
// that `make kube-bins` (hack/kube/build.sh) fills. Without them a test fails
// and says how to build them; it never skips, so a missing control plane
// cannot pass for a green run.
package kubetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	crlog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/yaml"

	"github.com/skiff-dev/skiff/api/crds"
	"github.com/skiff-dev/skiff/api/v1beta1"
	"github.com/skiff-dev/skiff/shared/certs"
)

var logOnce sync.Once

// Env is a running control plane.
type Env struct {
	// Config reaches the kube-apiserver as a cluster admin.
	Config *rest.Config
	// Client is a direct (uncached) client with Skiff's types registered.
	Client client.Client
	// Scheme has client-go's and Skiff's types.
	Scheme *runtime.Scheme
	// WorkDir holds everything the control plane writes; it is removed when
	// the test ends.
	WorkDir string

	env *envtest.Environment
}

// Options change what Start installs.
type Options struct {
	// NoPolicies leaves out api/policies, so that a test can show what a
	// host's identity could do without them (InstallRBAC adds the RBAC
	// alone, InstallPolicies everything).
	NoPolicies bool
	// Aggregator configures the kube-apiserver's aggregation layer (a
	// front-proxy CA and client certificate, and the request-header
	// flags), so that an APIService can send requests to an extension API
	// server such as sandbox-apiserver's.
	Aggregator bool
	// AggregatorRouting has the aggregator send requests to the endpoints
	// of an APIService's Service (its EndpointSlices) rather than to its
	// cluster IP (--enable-aggregator-routing), so that replicas outside
	// any cluster network serve behind one APIService. Needs Aggregator;
	// an ExternalName Service then no longer works.
	AggregatorRouting bool
	// LogDir, when set, receives etcd's and the kube-apiserver's output
	// (etcd.log, kube-apiserver.log), kept after the test. Without it the
	// output goes to the work folder and is removed; either way a failed
	// test prints the end of both.
	LogDir string
}

// Start starts etcd and kube-apiserver, installs the CRDs and the policies
// and waits until they are in force. Stopping is registered with t.Cleanup.
func Start(t testing.TB) *Env {
	t.Helper()
	return StartWith(t, Options{})
}

// StartWith is Start with options.
func StartWith(t testing.TB, o Options) *Env {
	t.Helper()
	// controller-runtime warns, with a stack trace, when nothing set its
	// logger; tests read failures from their own output instead.
	logOnce.Do(func() { crlog.SetLogger(logr.Discard()) })
	assets, err := AssetsDir()
	if err != nil {
		t.Fatalf("kubetest: %v", err)
	}
	defs, err := CRDs()
	if err != nil {
		t.Fatalf("kubetest: %v", err)
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatalf("kubetest: %v", err)
	}
	if err := v1beta1.AddToScheme(scheme); err != nil {
		t.Fatalf("kubetest: %v", err)
	}
	work := newWorkDir(t)
	etcd, apiserver := orphanProof(t, assets, filepath.Join(work, "bin"))
	env := &envtest.Environment{
		// Paths, set below, win over $KUBEBUILDER_ASSETS; this folder does not.
		BinaryAssetsDirectory:    assets,
		CRDs:                     defs,
		Scheme:                   scheme,
		ControlPlaneStartTimeout: 2 * time.Minute,
		ControlPlaneStopTimeout:  time.Minute,
		WebhookInstallOptions:    envtest.WebhookInstallOptions{LocalServingCertDir: filepath.Join(work, "webhook")},
	}
	logDir := o.LogDir
	if logDir == "" {
		logDir = work
	}
	etcdLog, apiLog := openLog(t, logDir, "etcd.log"), openLog(t, logDir, "kube-apiserver.log")
	env.ControlPlane.Etcd = &envtest.Etcd{Path: etcd, DataDir: filepath.Join(work, "etcd"), Out: etcdLog, Err: etcdLog}
	env.ControlPlane.APIServer = &envtest.APIServer{Path: apiserver, CertDir: filepath.Join(work, "certs"), Out: apiLog, Err: apiLog}
	if o.Aggregator {
		if err := frontProxy(env.ControlPlane.APIServer, filepath.Join(work, "front-proxy")); err != nil {
			t.Fatalf("kubetest: %v", err)
		}
		if o.AggregatorRouting {
			env.ControlPlane.APIServer.Configure().Set("enable-aggregator-routing", "true")
		}
	}
	start := time.Now()
	cfg, err := env.Start()
	// Register the stop before checking the error: a half-started plane
	// still has processes and folders to clean up.
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("kubetest: stop control plane: %v", err)
		}
	})
	if err != nil {
		t.Fatalf("kubetest: start control plane from %s: %v", assets, err)
	}
	t.Logf("kubetest: control plane at %s ready in %s", cfg.Host, time.Since(start).Round(time.Millisecond))
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatalf("kubetest: client: %v", err)
	}
	e := &Env{Config: cfg, Client: c, Scheme: scheme, WorkDir: work, env: env}
	if !o.NoPolicies {
		e.InstallPolicies(t)
	}
	return e
}

// openLog opens a control-plane log in dir; a failed test prints its end.
// It is registered before the control plane's stop, so it is closed (and
// printed) after the processes have ended.
func openLog(t testing.TB, dir, name string) *os.File {
	t.Helper()
	path := filepath.Join(dir, name)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatalf("kubetest: %v", err)
	}
	t.Cleanup(func() {
		_ = f.Close()
		if !t.Failed() {
			return
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return
		}
		const tail = 16 << 10
		if len(data) > tail {
			data = data[len(data)-tail:]
		}
		t.Logf("kubetest: %s (last %d KiB):\n%s", path, tail>>10, data)
	})
	return f
}

// StartCache starts an informer cache, as the readers run in production, with
// an informer for each of objs, and waits until they have synced. The cache
// stops, and its goroutines end, when the test ends.
func (e *Env) StartCache(tb testing.TB, objs ...client.Object) cache.Cache {
	tb.Helper()
	c, err := cache.New(e.Config, cache.Options{Scheme: e.Scheme})
	if err != nil {
		tb.Fatalf("kubetest: new cache: %v", err)
	}
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := c.Start(ctx); err != nil {
			tb.Errorf("kubetest: cache: %v", err)
		}
	})
	tb.Cleanup(func() { stop(); wg.Wait() })
	for _, obj := range objs {
		if _, err := c.GetInformer(tb.Context(), obj); err != nil {
			tb.Fatalf("kubetest: informer for %T: %v", obj, err)
		}
	}
	if !c.WaitForCacheSync(tb.Context()) {
		tb.Fatal("kubetest: cache did not sync")
	}
	return c
}

// CRDs returns the CustomResourceDefinitions embedded in api/crds.
func CRDs() ([]*apiextensionsv1.CustomResourceDefinition, error) {
	var out []*apiextensionsv1.CustomResourceDefinition
	err := fs.WalkDir(crds.FS, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".yaml") {
			return err
		}
		data, err := fs.ReadFile(crds.FS, path)
		if err != nil {
			return err
		}
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := yaml.UnmarshalStrict(data, crd); err != nil {
			return fmt.Errorf("decode %s: %w", path, err)
		}
		out = append(out, crd)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read embedded CRDs: %w", err)
	}
	if len(out) == 0 {
		return nil, errors.New("read embedded CRDs: none found")
	}
	return out, nil
}

// AssetsDir returns the folder holding etcd and kube-apiserver:
// $KUBEBUILDER_ASSETS if set, else the folder hack/kube/build.sh --print names.
func AssetsDir() (string, error) {
	dir := os.Getenv("KUBEBUILDER_ASSETS")
	if dir == "" {
		script, err := findUp(filepath.Join("hack", "kube", "build.sh"))
		if err != nil {
			return "", fmt.Errorf("find hack/kube/build.sh (or set KUBEBUILDER_ASSETS): %w", err)
		}
		var stdout, stderr bytes.Buffer
		cmd := exec.Command("bash", script, "--print")
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			return "", fmt.Errorf("%s --print: %w: %s", script, err, stderr.String())
		}
		dir = strings.TrimSpace(stdout.String())
	}
	for _, bin := range []string{"etcd", "kube-apiserver"} {
		if _, err := os.Stat(filepath.Join(dir, bin)); err != nil {
			return "", fmt.Errorf("no %s in %s: run `make kube-bins` first (it builds etcd and kube-apiserver from Go modules once): %w", bin, dir, err)
		}
	}
	return dir, nil
}

// findUp looks for rel in the working directory and each of its parents.
func findUp(rel string) (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		p := filepath.Join(dir, rel)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("%s not found above the working directory", rel)
		}
		dir = parent
	}
}

// frontProxy writes a front-proxy CA and the client certificate the
// aggregator presents to extension API servers into dir, and sets the
// kube-apiserver's flags for them (as kubeadm does): extension servers then
// trust the X-Remote-User and X-Remote-Group headers of requests signed
// by that CA, which they read from kube-system's
// extension-apiserver-authentication ConfigMap.
func frontProxy(s *envtest.APIServer, dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	ca, err := certs.NewCA("front-proxy-ca", 24*time.Hour)
	if err != nil {
		return err
	}
	client, err := ca.Client(24*time.Hour, "front-proxy-client")
	if err != nil {
		return err
	}
	files := map[string][]byte{"ca.crt": ca.PEM, "client.crt": client.Cert, "client.key": client.Key}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			return err
		}
	}
	s.Configure().
		Set("requestheader-client-ca-file", filepath.Join(dir, "ca.crt")).
		Set("requestheader-allowed-names", "front-proxy-client").
		Set("requestheader-username-headers", "X-Remote-User").
		Set("requestheader-group-headers", "X-Remote-Group").
		Set("requestheader-uid-headers", "X-Remote-Uid").
		Set("requestheader-extra-headers-prefix", "X-Remote-Extra-").
		Set("proxy-client-cert-file", filepath.Join(dir, "client.crt")).
		Set("proxy-client-key-file", filepath.Join(dir, "client.key"))
	return nil
}

// StopAPIServer kills the kube-apiserver (SIGKILL; etcd runs on), as an
// outage of the control plane; StartAPIServer brings it back on the same
// address.
func (e *Env) StopAPIServer(t testing.TB) {
	t.Helper()
	// The process is found by its certificate folder, this Env's own.
	marker := filepath.Join(e.WorkDir, "certs")
	killed := 0
	for _, pid := range findProcesses("kube-apiserver", marker) {
		if err := syscall.Kill(pid, syscall.SIGKILL); err == nil {
			killed++
		}
	}
	if killed == 0 {
		t.Fatalf("kubetest: no kube-apiserver process of %s found to kill", marker)
	}
	// envtest reaps it; its Stop then has nothing left to stop.
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := e.env.ControlPlane.APIServer.Stop()
		if err == nil || time.Now().After(deadline) {
			if err != nil {
				t.Fatalf("kubetest: stop kube-apiserver: %v", err)
			}
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("kubetest: killed kube-apiserver")
}

// StartAPIServer starts the kube-apiserver StopAPIServer stopped, on the
// same address and with the same certificates, and waits until it is
// ready.
func (e *Env) StartAPIServer(t testing.TB) {
	t.Helper()
	start := time.Now()
	if err := e.env.ControlPlane.APIServer.Start(); err != nil {
		t.Fatalf("kubetest: restart kube-apiserver: %v", err)
	}
	t.Logf("kubetest: kube-apiserver back in %s", time.Since(start).Round(time.Millisecond))
}
