// Package e2e runs vk-sandbox for real: a real kube-apiserver and etcd
// (shared/testing/kubetest), a real sandboxd as root with the base
// template, and vk-sandbox itself, each built from this workspace and run
// as its own process, which the tests stop, kill and start again.
package e2e

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/skiff-dev/skiff/shared/sandboxdapi"
	pb "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
	"github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1/sandboxdv1connect"
	"github.com/skiff-dev/skiff/shared/testing/kubetest"
)

// daemon is a process the test starts, stops and kills.
type daemon struct {
	t    testing.TB
	name string
	bin  string
	args []string
	log  string

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
}

func newDaemon(t testing.TB, dir, name, bin string, args ...string) *daemon {
	d := &daemon{t: t, name: name, bin: bin, args: args, log: filepath.Join(dir, name+".log")}
	t.Cleanup(func() {
		d.stop()
		if t.Failed() {
			data, _ := os.ReadFile(d.log)
			if len(data) > 64<<10 {
				data = data[len(data)-64<<10:]
			}
			t.Logf("%s (last 64 KiB):\n%s", filepath.Base(d.log), data)
		}
	})
	return d
}

// start runs the daemon in its own session, its output appended to its log.
func (d *daemon) start() {
	d.t.Helper()
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cmd != nil {
		d.t.Fatalf("%s is already running", d.name)
	}
	logf, err := os.OpenFile(d.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		d.t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(d.bin, d.args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		d.t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	d.cmd, d.exited = cmd, exited
}

// running reports whether the daemon runs.
func (d *daemon) running() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cmd == nil {
		return false
	}
	select {
	case <-d.exited:
		return false
	default:
		return true
	}
}

// signal sends sig and waits for the daemon to exit.
func (d *daemon) signal(sig syscall.Signal) {
	d.mu.Lock()
	cmd, exited := d.cmd, d.exited
	d.cmd = nil
	d.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(sig)
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		<-exited
		d.t.Errorf("%s did not exit within 30s of %v", d.name, sig)
	}
}

// stop ends the daemon with SIGTERM.
func (d *daemon) stop() { d.signal(syscall.SIGTERM) }

// kill9 ends the daemon at once, as a crash would.
func (d *daemon) kill9() { d.signal(syscall.SIGKILL) }

// system is one sandbox host with its vk-sandbox, and a control plane.
type system struct {
	t        *testing.T
	dir      string
	node     string
	kube     *kubernetes.Clientset
	dyn      dynamic.Interface
	cfg      *rest.Config
	kubectl  string
	kc       string // kubeconfig file
	sandboxd *daemon
	sbdAddr  string
	sbd      sandboxdv1connect.SandboxdServiceClient
	vkBin    string
	vkArgs   []string
	vk       *daemon
	admin    string
}

func build(t testing.TB, dir, pkg, out string, env ...string) string {
	t.Helper()
	bin := filepath.Join(dir, out)
	cmd := exec.Command("go", "build", "-o", bin, pkg)
	cmd.Env = append(os.Environ(), env...)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build %s: %v\n%s", pkg, err, b)
	}
	return bin
}

func freeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// newSystem starts the control plane, sandboxd (with the base template)
// and vk-sandbox with extra flags.
func newSystem(t *testing.T, vkFlags ...string) *system {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: sandboxd runs sandboxes")
	}
	for _, tool := range []string{"debootstrap", "nft"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is needed (apt-get install %s)", tool, map[string]string{"debootstrap": "debootstrap", "nft": "nftables"}[tool])
		}
	}
	env := kubetest.Start(t)
	assets, err := kubetest.AssetsDir()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "skiff-vk-e2e-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o711); err != nil { // sandboxes reach their root through it
		t.Fatal(err)
	}
	suffix := fmt.Sprintf("%03x", rand.IntN(0xfff))
	nftTable, cgroup := "skiff_vk_"+suffix, "skiff-vk-"+suffix
	forward, _ := os.ReadFile("/proc/sys/net/ipv4/ip_forward")
	t.Cleanup(func() {
		// After the daemons stopped (cleanups run last-registered first).
		_ = exec.Command("nft", "delete", "table", "inet", nftTable).Run()
		removeCgroups(t, cgroup)
		_ = syscall.Unmount(filepath.Join(dir, "run", "netns"), syscall.MNT_DETACH)
		if len(forward) > 0 {
			_ = os.WriteFile("/proc/sys/net/ipv4/ip_forward", forward, 0o644)
		}
		if err := os.RemoveAll(dir); err != nil {
			t.Errorf("remove %s: %v", dir, err)
		}
	})
	sandboxd := build(t, dir, "github.com/skiff-dev/skiff/sandboxd/cmd/sandboxd", "sandboxd", "CGO_ENABLED=1", "GOFLAGS=-tags=seccomp")
	build(t, dir, "github.com/skiff-dev/skiff/envd/cmd/envd", "envd", "CGO_ENABLED=0")
	vk := build(t, dir, "github.com/skiff-dev/skiff/vk-sandbox/cmd/vk-sandbox", "vk-sandbox", "CGO_ENABLED=0")

	state := filepath.Join(dir, "state")
	if out, err := exec.Command(sandboxd, "--state-dir", state, "template", "build", "base").CombinedOutput(); err != nil {
		t.Fatalf("template build base: %v\n%s", err, out)
	}
	token := fmt.Sprintf("node-token-%016x", rand.Uint64())
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte(token), 0o600); err != nil {
		t.Fatal(err)
	}
	s := &system{t: t, dir: dir, node: "host-vk-" + suffix, cfg: env.Config, kubectl: filepath.Join(assets, "kubectl"),
		kc: filepath.Join(dir, "kubeconfig"), vkBin: vk}
	s.kube = kubernetes.NewForConfigOrDie(env.Config)
	s.dyn = dynamic.NewForConfigOrDie(env.Config)
	writeKubeconfig(t, env.Config, s.kc)

	s.sbdAddr = freeAddr(t)
	s.sandboxd = newDaemon(t, dir, "sandboxd", sandboxd, "--state-dir", state, "serve",
		"--auth-token-file", tokenFile, "--listen", s.sbdAddr, "--admin-listen", freeAddr(t), "--run-dir", filepath.Join(dir, "run"),
		"--nft-table", nftTable, "--iface-prefix", "v"+suffix, "--cgroup-parent", cgroup, "--node-name", s.node,
		"--sandbox-cidr", fmt.Sprintf("10.%d.%d.0/22", 100+rand.IntN(100), rand.IntN(64)*4), "--overcommit", "16")
	s.sbd = sandboxdapi.NewClients(token, nil)(s.sbdAddr)
	s.startSandboxd()
	// Before sandboxd stops (which leaves sandboxes running, by design):
	// kill every sandbox, also when the test failed half-way, starting
	// sandboxd again if the test left it dead.
	t.Cleanup(func() {
		if !s.sandboxd.running() {
			s.sandboxd.start()
			s.waitSandboxd()
		}
		s.killAll()
	})

	s.admin = freeAddr(t)
	s.vkArgs = append([]string{"serve", "--kubeconfig", s.kc, "--node-name", s.node, "--node-ip", "127.0.0.1",
		"--sandboxd", s.sbdAddr, "--sandboxd-token-file", tokenFile, "--admin-listen", s.admin,
		"--kubelet-listen", "127.0.0.1:0", "--kubelet-insecure-no-auth", "--node-lease-duration", "4s", "--log-level", "debug"}, vkFlags...)
	s.vk = newDaemon(t, dir, "vk-sandbox", vk, s.vkArgs...)
	s.vk.start()
	return s
}

// mergeFlags replaces the values of flags in args by those in extra, and
// appends the others.
func mergeFlags(args, extra []string) []string {
	for i := 0; i+1 < len(extra); i += 2 {
		found := false
		for j := 0; j+1 < len(args); j++ {
			if args[j] == extra[i] {
				args[j+1], found = extra[i+1], true
			}
		}
		if !found {
			args = append(args, extra[i], extra[i+1])
		}
	}
	return args
}

func (s *system) startSandboxd() {
	s.t.Helper()
	s.sandboxd.start()
	s.waitSandboxd()
}

// waitSandboxd waits until sandboxd answers Info.
func (s *system) waitSandboxd() {
	s.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := s.sbd.Info(ctx, connect.NewRequest(&pb.InfoRequest{}))
		cancel()
		if err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	s.t.Fatal("sandboxd did not answer within 60s")
}

// killAll kills every sandbox on sandboxd, of any team and state.
func (s *system) killAll() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	resp, err := s.sbd.List(ctx, connect.NewRequest(&pb.ListRequest{}))
	if err != nil {
		s.t.Errorf("list sandboxes to kill: %v", err)
		return
	}
	for _, sb := range resp.Msg.GetSandboxes() {
		if _, err := s.sbd.Kill(ctx, connect.NewRequest(&pb.KillRequest{SandboxId: sb.GetId()})); err != nil && connect.CodeOf(err) != connect.CodeNotFound {
			s.t.Errorf("kill %s: %v", sb.GetId(), err)
		}
	}
}

// writeKubeconfig writes a kubeconfig file reaching cfg's cluster as cfg's
// user.
func writeKubeconfig(t *testing.T, cfg *rest.Config, path string) {
	t.Helper()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["test"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["test"] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData, Token: cfg.BearerToken}
	kc.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "test"}
	kc.CurrentContext = "test"
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatalf("write kubeconfig: %v", err)
	}
}

func removeCgroups(t testing.TB, rel string) {
	data, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Error(err)
		return
	}
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
		if err := os.Remove(filepath.Join(mount, own, rel)); err != nil && !os.IsNotExist(err) {
			t.Errorf("remove cgroup: %v", err)
		}
	}
}

// eventually polls cond every 100 ms until it holds or within passes.
func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", within, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// adminGet fetches a path of vk-sandbox's admin port.
func (s *system) adminGet(path string) (int, string) {
	resp, err := http.Get("http://" + s.admin + path)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}
