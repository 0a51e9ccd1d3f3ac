// Package e2e runs the single-host system for real: sandboxd (as root) with
// the base template, and sandbox-apiserver in single-host mode following it,
// both built from this workspace and run as their own processes; the test
// speaks e2b's REST API to the apiserver.
package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/skiff-dev/skiff/shared/sandboxdapi"
	sandboxdv1 "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
)

type system struct {
	t        testing.TB
	dir      string
	api      string
	sandboxd string // host:port
	token    string // the node token
	keyA     string
	keyB     string
	nftTable string
	cgroup   string
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

// start runs a daemon until the test ends (SIGTERM, then waits).
func start(t testing.TB, logPath, bin string, args ...string) {
	t.Helper()
	log, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		_ = log.Close()
		if t.Failed() {
			data, _ := os.ReadFile(logPath)
			t.Logf("%s:\n%s", filepath.Base(logPath), data)
		}
	})
}

func newSystem(t testing.TB) *system {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: sandboxd runs sandboxes")
	}
	for _, tool := range []string{"debootstrap", "nft"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is needed (apt-get install %s)", tool, map[string]string{"debootstrap": "debootstrap", "nft": "nftables"}[tool])
		}
	}
	dir, err := os.MkdirTemp("", "skiff-e2e-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o711); err != nil { // sandboxes reach their root through it
		t.Fatal(err)
	}
	s := &system{t: t, dir: dir}
	suffix := fmt.Sprintf("%03x", rand.IntN(0xfff))
	s.nftTable, s.cgroup = "skiff_api_"+suffix, "skiff-api-"+suffix
	t.Cleanup(func() {
		// After the daemons stopped (cleanups run last-registered first):
		// the rules and cgroups sandboxd leaves for its next start.
		_ = exec.Command("nft", "delete", "table", "inet", s.nftTable).Run()
		removeCgroups(t, s.cgroup)
		_ = syscall.Unmount(filepath.Join(dir, "run", "netns"), syscall.MNT_DETACH)
		if err := os.RemoveAll(dir); err != nil {
			t.Errorf("remove %s: %v", dir, err)
		}
	})
	sandboxd := build(t, dir, "github.com/skiff-dev/skiff/sandboxd/cmd/sandboxd", "sandboxd", "CGO_ENABLED=1", "GOFLAGS=-tags=seccomp")
	build(t, dir, "github.com/skiff-dev/skiff/envd/cmd/envd", "envd", "CGO_ENABLED=0")
	apiserver := build(t, dir, "github.com/skiff-dev/skiff/apiserver/cmd/sandbox-apiserver", "sandbox-apiserver")

	state := filepath.Join(dir, "state")
	if out, err := exec.Command(sandboxd, "--state-dir", state, "template", "build", "base").CombinedOutput(); err != nil {
		t.Fatalf("template build base: %v\n%s", err, out)
	}
	token := filepath.Join(dir, "token")
	s.token = fmt.Sprintf("node-token-%016x", rand.Uint64())
	if err := os.WriteFile(token, []byte(s.token), 0o600); err != nil {
		t.Fatal(err)
	}
	sbd := freeAddr(t)
	s.sandboxd = sbd
	start(t, filepath.Join(dir, "sandboxd.log"), sandboxd, "--state-dir", state, "serve",
		"--auth-token-file", token, "--listen", sbd, "--admin-listen", freeAddr(t), "--run-dir", filepath.Join(dir, "run"),
		"--nft-table", s.nftTable, "--iface-prefix", "a"+suffix, "--cgroup-parent", s.cgroup, "--node-name", "host-a",
		"--sandbox-cidr", fmt.Sprintf("10.%d.%d.0/22", 100+rand.IntN(100), rand.IntN(64)*4), "--overcommit", "64") // 2 CPUs hold 64 sandboxes of 2000m
	// Before sandboxd stops (which leaves sandboxes running, by design):
	// kill every sandbox, also when the test failed half-way.
	t.Cleanup(func() { s.killAll() })

	keys := filepath.Join(dir, "keys")
	for _, k := range []*string{&s.keyA, &s.keyB} {
		team := map[*string]string{&s.keyA: "team-a", &s.keyB: "team-b"}[k]
		out, err := exec.Command(apiserver, "keys", "create", "--team", team, "--api-keys-file", keys).Output()
		if err != nil {
			t.Fatal(err)
		}
		*k = strings.TrimSpace(string(out))
	}
	s.api = "http://" + freeAddr(t)
	start(t, filepath.Join(dir, "apiserver.log"), apiserver, "serve", "--listen", strings.TrimPrefix(s.api, "http://"),
		"--sandboxd", sbd, "--sandboxd-token-file", token, "--api-keys-file", keys, "--admin-listen", freeAddr(t))
	s.waitForHost()
	return s
}

// killAll kills every sandbox on sandboxd, of any team and state.
func (s *system) killAll() {
	client := sandboxdapi.NewClients(s.token, nil)(s.sandboxd)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	resp, err := client.List(ctx, connect.NewRequest(&sandboxdv1.ListRequest{}))
	if err != nil {
		s.t.Errorf("list sandboxes to kill: %v", err)
		return
	}
	for _, sb := range resp.Msg.GetSandboxes() {
		if _, err := client.Kill(ctx, connect.NewRequest(&sandboxdv1.KillRequest{SandboxId: sb.GetId()})); err != nil && connect.CodeOf(err) != connect.CodeNotFound {
			s.t.Errorf("kill %s: %v", sb.GetId(), err)
		}
	}
}

// waitForHost waits until the apiserver lists the host's template: sandboxd
// is up and the apiserver follows its Watch stream.
func (s *system) waitForHost() {
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		code, body := s.call(s.keyA, http.MethodGet, "/templates", nil)
		if code == http.StatusOK && strings.Contains(string(body), `"base"`) {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	s.t.Fatal("the apiserver never saw the host's base template")
}

func (s *system) call(key, method, path string, body any) (int, []byte) {
	s.t.Helper()
	var in bytes.Buffer
	if body != nil {
		if err := json.NewEncoder(&in).Encode(body); err != nil {
			s.t.Fatal(err)
		}
	}
	req, err := http.NewRequest(method, s.api+path, &in)
	if err != nil {
		s.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("X-API-Key", key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, []byte(err.Error())
	}
	defer resp.Body.Close()
	var out bytes.Buffer
	_, _ = out.ReadFrom(resp.Body)
	return resp.StatusCode, out.Bytes()
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

func TestSingleHostThroughTheE2BAPI(t *testing.T) {
	s := newSystem(t)

	// Create (v2: always a token), as team-a.
	code, body := s.call(s.keyA, http.MethodPost, "/v2/sandboxes", map[string]any{"templateID": "base", "timeout": 120, "metadata": map[string]string{"purpose": "e2e"}})
	if code != http.StatusCreated {
		t.Fatalf("create: %d %s", code, body)
	}
	var created struct {
		SandboxID, ClientID, EnvdAccessToken, EnvdVersion string
	}
	if err := json.Unmarshal(body, &created); err != nil {
		t.Fatal(err)
	}
	if len(created.SandboxID) != 20 || created.ClientID != "host-a" || created.EnvdAccessToken == "" || created.EnvdVersion == "" {
		t.Fatalf("created %s", body)
	}
	id := created.SandboxID
	// Read-your-writes: it is listed and got at once.
	code, body = s.call(s.keyA, http.MethodGet, "/v2/sandboxes?metadata="+`purpose%3De2e`, nil)
	if code != http.StatusOK || !strings.Contains(string(body), id) {
		t.Errorf("list: %d %s", code, body)
	}
	if code, body = s.call(s.keyA, http.MethodGet, "/sandboxes/"+id, nil); code != http.StatusOK || !strings.Contains(string(body), `"state":"running"`) {
		t.Errorf("get: %d %s", code, body)
	}
	// Another team sees nothing of it: 404 like a missing sandbox.
	if code, _ = s.call(s.keyB, http.MethodGet, "/sandboxes/"+id, nil); code != http.StatusNotFound {
		t.Errorf("get by another team: %d", code)
	}
	if code, body = s.call(s.keyB, http.MethodGet, "/v2/sandboxes", nil); code != http.StatusOK || strings.Contains(string(body), id) {
		t.Errorf("list by another team: %d %s", code, body)
	}
	if code, _ = s.call(s.keyB, http.MethodDelete, "/sandboxes/"+id, nil); code != http.StatusNotFound {
		t.Errorf("kill by another team: %d", code)
	}
	// No key, or a wrong one: 401.
	if code, _ = s.call("", http.MethodGet, "/v2/sandboxes", nil); code != http.StatusUnauthorized {
		t.Errorf("no key: %d", code)
	}
	if code, _ = s.call("e2b_"+strings.Repeat("0", 40), http.MethodGet, "/v2/sandboxes", nil); code != http.StatusUnauthorized {
		t.Errorf("wrong key: %d", code)
	}
	// An unknown template is a 400 naming it, and reaches no host.
	if code, body = s.call(s.keyA, http.MethodPost, "/v2/sandboxes", map[string]any{"templateID": "no-such"}); code != http.StatusBadRequest || !strings.Contains(string(body), "templateID") {
		t.Errorf("unknown template: %d %s", code, body)
	}
	// Pause, pause again (409), connect resumes it (201), then kill (204),
	// then it is gone (404).
	if code, body = s.call(s.keyA, http.MethodPost, "/sandboxes/"+id+"/pause", nil); code != http.StatusNoContent {
		t.Errorf("pause: %d %s", code, body)
	}
	if code, _ = s.call(s.keyA, http.MethodPost, "/sandboxes/"+id+"/pause", nil); code != http.StatusConflict {
		t.Errorf("second pause: %d", code)
	}
	if code, body = s.call(s.keyA, http.MethodPost, "/sandboxes/"+id+"/connect", map[string]any{"timeout": 60}); code != http.StatusCreated || !strings.Contains(string(body), created.EnvdAccessToken) {
		t.Errorf("connect to the paused sandbox: %d %s", code, body)
	}
	if code, _ = s.call(s.keyA, http.MethodPost, "/sandboxes/"+id+"/connect", map[string]any{"timeout": 60}); code != http.StatusOK {
		t.Errorf("connect to the running sandbox: %d", code)
	}
	if code, _ = s.call(s.keyA, http.MethodDelete, "/sandboxes/"+id, nil); code != http.StatusNoContent {
		t.Errorf("kill: %d", code)
	}
	if code, _ = s.call(s.keyA, http.MethodDelete, "/sandboxes/"+id, nil); code != http.StatusNotFound {
		t.Errorf("second kill: %d", code)
	}
	s.checkPrivateAutoResume(t)
}
