// Package system runs the whole Skiff system on one machine, as separate
// processes built from this workspace: sandboxd (as root, with the base
// template), sandbox-apiserver in single-host mode following it, and
// sandbox-envd-proxy in front of its relay, plus an API key per team. It is
// `make up`, and the SDK suite runs on exactly the same path.
//
// Once started, a server that exits on its own is restarted (see
// supervise.go): only Stop, the operator's Ctrl-C, takes the system down
// and removes what sandboxd keeps on the host.
package system

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/skiff-dev/skiff/shared/cgroups"
	"github.com/skiff-dev/skiff/shared/testing/loopback"
)

// Binaries are the programs a System runs, all in one directory.
var Binaries = []string{"sandboxd", "envd", "sandbox-apiserver", "sandbox-envd-proxy"}

// make up's per-team limits: sandbox-apiserver's defaults (e2b's for a Pro
// team), passed explicitly so that a change there does not change make up
// unseen.
const (
	DefaultCreateRatePerTeam   = 5
	DefaultCreateBurstPerTeam  = 20
	DefaultMaxSandboxesPerTeam = 100
	// DefaultMemoryOvercommit is make up's sandboxd --memory-overcommit:
	// 16 default sandboxes (512 MiB each) per GiB of the machine's memory.
	DefaultMemoryOvercommit = "8"
)

// Config is one system on this machine. Every address should be on
// loopback: the system has no TLS and its sandboxd a shared token.
type Config struct {
	// Bin is the directory holding Binaries.
	Bin string
	// State keeps sandboxd's records and templates, the node token, the
	// keys file and the logs across runs.
	State string
	// RunDir holds the sandboxes' network namespaces; a tmpfs such as /run.
	RunDir string
	// APIListen, APIAdmin, ProxyListen, ProxyAdmin, SandboxdListen and
	// SandboxdAdmin are the addresses (host:port) of the servers and of
	// their /metrics, /healthz and /readyz.
	APIListen, APIAdmin, ProxyListen, ProxyAdmin, SandboxdListen, SandboxdAdmin string
	// Teams get one API key each, kept in the keys file and reused on the
	// next run.
	Teams []string
	// MemoryOvercommit is sandboxd's --memory-overcommit: how far the
	// sandboxes' memory may exceed the host's (e2b's default sandbox asks
	// for 512 MiB and an idle one uses a few). CPU is sandboxd's default:
	// not admitted, a sandbox's vCPUs are its limit.
	MemoryOvercommit string
	// Runtime is sandboxd's --runtime (native or gvisor); RunscPath its
	// --runsc for gvisor.
	Runtime, RunscPath string
	// SandboxdArgs are more flags for sandboxd serve (a test's
	// --allow-cidr, say).
	SandboxdArgs []string
	// NodeName names the one host.
	NodeName string
	// NFTTable, CgroupParent, IfacePrefix and SandboxCIDR are sandboxd's
	// host resources; distinct values let two systems share a machine.
	NFTTable, CgroupParent, IfacePrefix, SandboxCIDR string
	// CreateRatePerTeam, CreateBurstPerTeam and MaxSandboxesPerTeam are
	// the apiserver's per-team limits, always passed (0: no limit; the
	// burst only counts with a rate).
	CreateRatePerTeam                       float64
	CreateBurstPerTeam, MaxSandboxesPerTeam int
	// WarmPools are the apiserver's --warm-pool values (template=replicas).
	WarmPools []string
	// Domain, when set, turns domain mode on (domain.go): the system also
	// answers https://api.<Domain> and https://<port>-<id>.<Domain> on
	// loopback port DomainPort ("443" when empty), with a certificate of
	// a local CA kept in State/domain.
	Domain, DomainPort string
	// Env is added to the servers' environment (sandboxd's, the
	// apiserver's and the proxy's), which is otherwise this process's:
	// e.g. OTEL_EXPORTER_OTLP_ENDPOINT, to export their traces.
	Env []string
	// Progress receives a line per step; nil discards them.
	Progress io.Writer
	// Disposable says that nothing starts on State again (a test's or a
	// benchmark's system): when Stop cannot kill the sandboxes through
	// sandboxd, it ends their processes and unmounts what they held
	// itself, and removes the host resources all the same, rather than
	// keep them for a next start that never comes.
	Disposable bool
}

// System is a running system.
type System struct {
	cfg Config
	// APIURL is E2B_API_URL, SandboxURL E2B_SANDBOX_URL: the servers'
	// own addresses, plain HTTP on loopback.
	APIURL, SandboxURL string
	// E2BDomain is E2B_DOMAIN in domain mode (the domain, with :port
	// when that is not 443), and DomainFiles the CA its clients trust.
	E2BDomain   string
	DomainFiles DomainFiles
	// Keys maps each team to its API key (E2B_API_KEY).
	Keys map[string]string

	front       *front        // domain mode's listener
	procs       []*proc       // in start order
	quit        chan struct{} // closed by Stop: no more restarts
	supervisors sync.WaitGroup
	progressMu  sync.Mutex
}

// Start builds the base template (cached after the first time), then starts
// sandboxd, the apiserver and the proxy, and returns once the apiserver
// lists the host's base template and the proxy is ready. On error it stops
// whatever it started.
func Start(ctx context.Context, cfg Config) (_ *System, err error) {
	if cfg.Progress == nil {
		cfg.Progress = io.Discard
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("the system needs root: sandboxd makes namespaces, cgroups, veths and nftables rules")
	}
	for _, tool := range []string{"nft", "debootstrap"} {
		if _, err := exec.LookPath(tool); err != nil {
			pkg := map[string]string{"nft": "nftables", "debootstrap": "debootstrap"}[tool]
			return nil, fmt.Errorf("%s is missing: apt-get install %s", tool, pkg)
		}
	}
	for _, b := range Binaries {
		if _, err := os.Stat(filepath.Join(cfg.Bin, b)); err != nil {
			return nil, fmt.Errorf("binary %s: %w (make build puts them in bin/)", b, err)
		}
	}
	// Sandboxes reach their root filesystem through State: others may
	// traverse it, not list it.
	for _, d := range []string{cfg.State, filepath.Join(cfg.State, "logs")} {
		if err := os.MkdirAll(d, 0o711); err != nil {
			return nil, fmt.Errorf("make state dir: %w", err)
		}
	}
	if err := os.Chmod(cfg.State, 0o711); err != nil {
		return nil, fmt.Errorf("make state dir traversable: %w", err)
	}
	s := &System{cfg: cfg, Keys: make(map[string]string)}
	defer func() {
		if err != nil {
			s.stopProcesses()
			if s.front != nil {
				s.front.close()
			}
			if cfg.Disposable {
				_ = unmountUnder(cfg.RunDir)
			}
		}
	}()
	if cfg.Disposable {
		// sandboxd's --run-dir is a tmpfs on a host (/run): so is a
		// disposable system's, which Stop unmounts with the rest.
		if err := mountTmpfs(cfg.RunDir); err != nil {
			return nil, err
		}
	}
	var cert *tls.Certificate
	if cfg.Domain != "" {
		if cfg.DomainPort == "" {
			cfg.DomainPort = "443"
		}
		s.E2BDomain = cfg.Domain
		if cfg.DomainPort != "443" {
			s.E2BDomain = net.JoinHostPort(cfg.Domain, cfg.DomainPort)
		}
		if err := checkDomainResolves(ctx, cfg.Domain); err != nil {
			return nil, err
		}
		if cert, s.DomainFiles, err = domainTLS(filepath.Join(cfg.State, "domain"), cfg.Domain); err != nil {
			return nil, fmt.Errorf("domain mode: %w", err)
		}
	}

	sandboxdBin := filepath.Join(cfg.Bin, "sandboxd")
	sbState := filepath.Join(cfg.State, "sandboxd")
	fmt.Fprintln(cfg.Progress, "preparing the base template (debootstrap, cached after the first run)...")
	build := exec.CommandContext(ctx, sandboxdBin, "--state-dir", sbState, "template", "build", "base")
	var buildOut strings.Builder
	build.Stdout, build.Stderr = &buildOut, &buildOut
	if err := build.Run(); err != nil {
		return nil, fmt.Errorf("sandboxd template build base: %w\n%s", err, buildOut.String())
	}

	token, err := secretFile(filepath.Join(cfg.State, "node-token"))
	if err != nil {
		return nil, err
	}
	keysFile := filepath.Join(cfg.State, "api-keys")
	for _, team := range cfg.Teams {
		if s.Keys[team], err = teamKey(ctx, filepath.Join(cfg.Bin, "sandbox-apiserver"), keysFile, team); err != nil {
			return nil, err
		}
	}

	args := []string{"--state-dir", sbState, "serve",
		"--listen", cfg.SandboxdListen, "--admin-listen", cfg.SandboxdAdmin,
		"--auth-token-file", token, "--node-name", cfg.NodeName, "--run-dir", cfg.RunDir,
		"--envd", filepath.Join(cfg.Bin, "envd")}
	for flag, v := range map[string]string{"--memory-overcommit": cfg.MemoryOvercommit, "--runtime": cfg.Runtime, "--runsc": cfg.RunscPath, "--nft-table": cfg.NFTTable,
		"--cgroup-parent": cfg.CgroupParent, "--iface-prefix": cfg.IfacePrefix, "--sandbox-cidr": cfg.SandboxCIDR} {
		if v != "" {
			args = append(args, flag, v)
		}
	}
	args = append(args, cfg.SandboxdArgs...)
	if err := s.start("sandboxd", sandboxdBin, args...); err != nil {
		return nil, err
	}
	if err := s.waitHTTP(ctx, "sandboxd", "http://"+cfg.SandboxdAdmin+"/healthz", 30*time.Second); err != nil {
		return nil, err
	}
	apiArgs := []string{"serve",
		"--listen", cfg.APIListen, "--admin-listen", cfg.APIAdmin, "--inventory", "static", "--sandboxd", cfg.SandboxdListen,
		"--sandboxd-token-file", token, "--api-keys-file", keysFile,
		"--create-rate-per-team", strconv.FormatFloat(cfg.CreateRatePerTeam, 'g', -1, 64),
		"--create-burst-per-team", strconv.Itoa(max(cfg.CreateBurstPerTeam, 1)),
		"--max-sandboxes-per-team", strconv.Itoa(cfg.MaxSandboxesPerTeam)}
	for _, p := range cfg.WarmPools {
		apiArgs = append(apiArgs, "--warm-pool", p)
	}
	if s.E2BDomain != "" {
		apiArgs = append(apiArgs, "--sandbox-domain", s.E2BDomain)
	}
	if err := s.start("sandbox-apiserver", filepath.Join(cfg.Bin, "sandbox-apiserver"), apiArgs...); err != nil {
		return nil, err
	}
	if err := s.start("sandbox-envd-proxy", filepath.Join(cfg.Bin, "sandbox-envd-proxy"), "serve",
		"--listen", cfg.ProxyListen, "--admin-listen", cfg.ProxyAdmin, "--inventory", "static",
		"--sandboxd", cfg.SandboxdListen, "--sandboxd-token-file", token); err != nil {
		return nil, err
	}
	s.APIURL, s.SandboxURL = "http://"+cfg.APIListen, "http://"+cfg.ProxyListen
	if err := s.waitHTTP(ctx, "sandbox-envd-proxy", "http://"+cfg.ProxyAdmin+"/readyz", 30*time.Second); err != nil {
		return nil, err
	}
	if err := s.waitTemplate(ctx, 60*time.Second); err != nil {
		return nil, err
	}
	if cert != nil {
		errLog := log.New(&progressLines{s: s, prefix: "domain front: "}, "", 0)
		if s.front, err = startFront(cfg.Domain, cfg.DomainPort, cert, cfg.APIListen, cfg.ProxyListen, errLog); err != nil {
			return nil, err
		}
		s.progressf("serving https://api.%s and https://*.%s on loopback", s.E2BDomain, s.E2BDomain)
	}
	s.supervise()
	return s, nil
}

// Stop ends the restarts, kills every sandbox through sandboxd's API, then
// stops the servers (SIGTERM, then SIGKILL after 20 s) and removes the
// host resources sandboxd keeps for its next start. When the sandboxes
// could not be killed (sandboxd was down), it keeps those resources — the
// nftables table above all, which isolates the sandboxes still running —
// for the next start's sandboxd to re-adopt them, unless the system is
// Disposable: then it ends the sandboxes itself and removes them anyway,
// and returns the error of the kill along with any other.
func (s *System) Stop(ctx context.Context) error {
	s.stopSupervising()
	if s.front != nil {
		s.front.close()
	}
	var errs []error
	if len(s.procs) > 0 { // sandboxd was started
		if err := s.killSandboxes(ctx); err != nil {
			s.stopProcesses()
			if !s.cfg.Disposable {
				return fmt.Errorf("kill the sandboxes: %w (kept nftables table %s, cgroup %s and %s for the next start, which re-adopts the sandboxes)",
					err, s.cfg.NFTTable, s.cfg.CgroupParent, s.cfg.RunDir)
			}
			errs = append(errs, fmt.Errorf("kill the sandboxes through sandboxd: %w (ended their processes and removed what they held instead)", err),
				s.endSandboxes())
		}
	}
	s.stopProcesses()
	if s.cfg.Disposable {
		// Whatever the sandboxes left mounted (their roots and disks, the
		// files of their network namespaces), before the caller removes
		// the directories.
		errs = append(errs, unmountUnder(s.cfg.State), unmountUnder(s.cfg.RunDir))
	}
	if s.cfg.NFTTable != "" {
		if out, err := exec.Command("nft", "delete", "table", "inet", s.cfg.NFTTable).CombinedOutput(); err != nil && !strings.Contains(string(out), "No such file") {
			errs = append(errs, fmt.Errorf("nft delete table %s: %w: %s", s.cfg.NFTTable, err, out))
		}
	}
	if s.cfg.CgroupParent != "" {
		errs = append(errs, cgroups.Remove(s.cfg.CgroupParent))
	}
	if err := syscall.Unmount(filepath.Join(s.cfg.RunDir, "netns"), syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
		errs = append(errs, fmt.Errorf("unmount the netns dir: %w", err))
	}
	return errors.Join(errs...)
}

// LogTail returns the last lines of a server's log, for an error message.
func (s *System) LogTail(name string, lines int) string {
	for _, p := range s.procs {
		if p.name == name {
			data, _ := os.ReadFile(p.log)
			all := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
			return strings.Join(all[max(0, len(all)-lines):], "\n")
		}
	}
	return ""
}

// SandboxdURL is sandboxd's API and relay (http://host:port), and
// NodeToken the token it accepts (Skiff-Node-Token), for tests that talk
// to it directly.
func (s *System) SandboxdURL() string { return "http://" + s.cfg.SandboxdListen }

// NodeToken returns the token sandboxd accepts.
func (s *System) NodeToken() (string, error) {
	b, err := os.ReadFile(filepath.Join(s.cfg.State, "node-token"))
	return strings.TrimSpace(string(b)), err
}

// Config returns the configuration the system runs with.
func (s *System) Config() Config { return s.cfg }

// LogDir is where the servers write their logs.
func (s *System) LogDir() string { return filepath.Join(s.cfg.State, "logs") }

func (s *System) start(name, bin string, args ...string) error {
	p := &proc{name: name, bin: bin, args: args, env: s.cfg.Env, log: filepath.Join(s.LogDir(), name+".log")}
	if err := p.run(true); err != nil {
		return err
	}
	s.procs = append(s.procs, p)
	s.progressf("started %s (pid %d, log %s)", name, p.pid(), p.log)
	return nil
}

// stopProcesses stops the servers, last started first.
func (s *System) stopProcesses() {
	for i := len(s.procs) - 1; i >= 0; i-- {
		s.procs[i].stop(20 * time.Second)
	}
	s.procs = nil
}

func (s *System) waitHTTP(ctx context.Context, name, url string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode < 300 {
				return nil
			}
		}
		if err := s.exitedErr(); err != nil {
			return err
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("%s did not answer %s within %s; its log ends:\n%s", name, url, timeout, s.LogTail(name, 20))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitTemplate waits until the apiserver follows sandboxd: it lists the
// host's base template.
func (s *System) waitTemplate(ctx context.Context, timeout time.Duration) error {
	var key string
	for _, k := range s.Keys {
		key = k
	}
	deadline := time.Now().Add(timeout)
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.APIURL+"/templates", nil)
		req.Header.Set("X-API-Key", key)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			body, _ := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK && strings.Contains(string(body), `"base"`) {
				return nil
			}
		}
		if err := s.exitedErr(); err != nil {
			return err
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("the apiserver did not list the base template within %s; its log ends:\n%s", timeout, s.LogTail("sandbox-apiserver", 20))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (s *System) exitedErr() error {
	for _, p := range s.procs {
		cmd, done, _ := p.current()
		select {
		case <-done:
			return fmt.Errorf("%s exited (%v); its log ends:\n%s", p.name, cmd.ProcessState, s.LogTail(p.name, 20))
		default:
		}
	}
	return nil
}

// killSandboxes kills every sandbox on sandboxd — running, paused and
// warm, of any team — through its own API (Connect's JSON protocol).
func (s *System) killSandboxes(ctx context.Context) error {
	var list struct {
		Sandboxes []struct {
			ID string `json:"id"`
		} `json:"sandboxes"`
	}
	if err := s.sandboxdCall(ctx, "List", struct{}{}, &list); err != nil {
		return err
	}
	var errs []error
	for _, sb := range list.Sandboxes {
		if err := s.sandboxdCall(ctx, "Kill", map[string]string{"sandboxId": sb.ID}, nil); err != nil && !strings.Contains(err.Error(), "not_found") {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// sandboxdCall makes a unary call of sandboxd's SandboxdService.
func (s *System) sandboxdCall(ctx context.Context, method string, in, out any) error {
	body, err := json.Marshal(in)
	if err != nil {
		return err
	}
	token, err := s.NodeToken()
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+s.cfg.SandboxdListen+"/skiff.sandboxd.v1.SandboxdService/"+method, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("sandboxd %s: %w", method, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("sandboxd %s: %d %s", method, resp.StatusCode, data)
	}
	if out != nil {
		return json.Unmarshal(data, out)
	}
	return nil
}

// secretFile returns path, first writing a random token there if it does
// not exist.
func secretFile(path string) (string, error) {
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	if err := os.WriteFile(path, []byte(hex.EncodeToString(b)+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("write the node token: %w", err)
	}
	return path, nil
}

// teamKey returns the team's key from the keys file, creating one with
// `sandbox-apiserver keys create` when it has none.
func teamKey(ctx context.Context, apiserver, keysFile, team string) (string, error) {
	if f, err := os.Open(keysFile); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) == 2 && fields[0] == team {
				_ = f.Close()
				return fields[1], nil
			}
		}
		_ = f.Close()
	}
	out, err := exec.CommandContext(ctx, apiserver, "keys", "create", "--team", team, "--api-keys-file", keysFile).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return "", fmt.Errorf("keys create --team %s: %w: %s", team, err, ee.Stderr)
		}
		return "", fmt.Errorf("keys create --team %s: %w", team, err)
	}
	return strings.TrimSpace(string(out)), nil
}

// FreeAddr returns a loopback address with a port that was free a moment
// ago, and not handed out before in this process (loopback.FreeAddr).
func FreeAddr() (string, error) { return loopback.FreeAddr() }

// LocalConfig is a system for a test or benchmark: the servers on free
// loopback ports, and host resources of its own (nftables table, cgroup,
// veth names, a /22 of sandbox addresses at random), so that it shares the
// machine with make up or another such system. The rest is the Config's
// zero value: sandboxd's defaults and no per-team limits. It is
// Disposable: its Stop leaves nothing of it on the host.
func LocalConfig(bin, state string, teams ...string) (Config, error) {
	addrs := make([]string, 6)
	for i := range addrs {
		var err error
		if addrs[i], err = FreeAddr(); err != nil {
			return Config{}, err
		}
	}
	suffix := fmt.Sprintf("%03x", mrand.IntN(0xfff))
	return Config{
		Bin: bin, State: state, RunDir: filepath.Join(state, "run"),
		APIListen: addrs[0], ProxyListen: addrs[1], ProxyAdmin: addrs[2], SandboxdListen: addrs[3], SandboxdAdmin: addrs[4], APIAdmin: addrs[5],
		Teams: teams, NodeName: "test-host",
		NFTTable: "skiff_sys_" + suffix, CgroupParent: "skiff-sys-" + suffix, IfacePrefix: "y" + suffix,
		SandboxCIDR: fmt.Sprintf("10.%d.%d.0/22", 100+mrand.IntN(100), mrand.IntN(64)*4),
		Disposable:  true,
	}, nil
}
