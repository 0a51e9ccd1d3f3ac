// Package e2e runs vk-sandbox for real: a real kube-apiserver and etcd
// (shared/testing/kubetest), a real sandboxd as root with the base
// template, and vk-sandbox itself, each built from this workspace and run
// as its own process, which the tests stop, kill and start again.
package e2e

import (
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1/sandboxdv1connect"
	"github.com/skiff-dev/skiff/shared/testing/hosttest"
	"github.com/skiff-dev/skiff/shared/testing/kubetest"
)

// system is one sandbox host with its vk-sandbox, and a control plane.
type system struct {
	t        *testing.T
	dir      string
	node     string
	kube     *kubernetes.Clientset
	dyn      dynamic.Interface
	client   client.Client // the admin's, for kubeinventory.Join
	cfg      *rest.Config
	kubectl  string
	kc       string // kubeconfig file
	host     *hosttest.Host
	sandboxd *hosttest.Daemon
	sbdAddr  string
	sbd      sandboxdv1connect.SandboxdServiceClient
	vkBin    string
	vkArgs   []string
	vk       *hosttest.Daemon
	admin    string
}

func newSystem(t *testing.T, vkFlags ...string) *system {
	t.Helper()
	env := kubetest.Start(t)
	assets, err := kubetest.AssetsDir()
	if err != nil {
		t.Fatal(err)
	}
	node := fmt.Sprintf("host-vk-%03x", rand.IntN(0xfff))
	h := hosttest.NewHost(t, hosttest.Options{Name: "vk", NodeName: node,
		Build: []string{"github.com/skiff-dev/skiff/vk-sandbox/cmd/vk-sandbox"}})
	s := &system{t: t, dir: h.Dir, node: node, cfg: env.Config, kubectl: filepath.Join(assets, "kubectl"),
		kc: env.Kubeconfig(t), host: h, sandboxd: h.Sandboxd, sbdAddr: h.Addr, sbd: h.Client, vkBin: h.Bins["vk-sandbox"]}
	s.kube = kubernetes.NewForConfigOrDie(env.Config)
	s.dyn = dynamic.NewForConfigOrDie(env.Config)
	s.client = env.Client

	s.admin = hosttest.FreeAddr(t)
	s.vkArgs = append([]string{"serve", "--kubeconfig", s.kc, "--node-name", s.node, "--node-ip", "127.0.0.1",
		"--sandboxd", s.sbdAddr, "--sandboxd-token-file", h.TokenFile, "--admin-listen", s.admin,
		"--kubelet-listen", "127.0.0.1:0", "--kubelet-insecure-no-auth", "--node-lease-duration", "4s", "--log-level", "debug"}, vkFlags...)
	s.vk = hosttest.NewDaemon(t, h.Dir, "vk-sandbox", s.vkBin, s.vkArgs...)
	s.vk.Start()
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
