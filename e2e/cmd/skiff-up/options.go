package main

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"

	"github.com/spf13/pflag"

	"github.com/skiff-dev/skiff/e2e/internal/system"
)

// options are skiff-up's flags: the system.Config of the whole system on
// this machine.
type options struct {
	cfg system.Config
}

func newOptions() *options {
	return &options{cfg: system.Config{Teams: []string{"default"}, NodeName: "local"}}
}

// AddFlags registers skiff-up's flags.
func (o *options) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.cfg.Bin, "bin", "bin", "Directory of sandboxd, envd, sandbox-apiserver and sandbox-envd-proxy (make up passes its bin/); not empty.")
	fs.StringVar(&o.cfg.State, "state-dir", "/var/lib/skiff/up", "Where templates, records, the node token, the API keys and the logs are kept across runs; not empty. "+
		"Sandboxes must be able to traverse its parents: not under /root.")
	fs.StringVar(&o.cfg.RunDir, "run-dir", "/run/skiff-up", "Directory (on a tmpfs) of the sandboxes' network namespaces (sandboxd --run-dir); not empty.")
	fs.StringVar(&o.cfg.APIListen, "api-listen", "127.0.0.1:3000", "Address (host:port) of the e2b API (E2B_API_URL).")
	fs.StringVar(&o.cfg.APIAdmin, "api-admin-listen", "127.0.0.1:3001", "Address (host:port) of the API's /metrics, /healthz and /readyz.")
	fs.StringVar(&o.cfg.ProxyListen, "proxy-listen", "127.0.0.1:3002", "Address (host:port) of the envd proxy (E2B_SANDBOX_URL).")
	fs.StringVar(&o.cfg.ProxyAdmin, "proxy-admin-listen", "127.0.0.1:3003", "Address (host:port) of the proxy's /metrics, /healthz and /readyz.")
	fs.StringVar(&o.cfg.SandboxdListen, "sandboxd-listen", "127.0.0.1:27777", "Address (host:port) of sandboxd's API and relay.")
	fs.StringVar(&o.cfg.SandboxdAdmin, "sandboxd-admin-listen", "127.0.0.1:27778", "Address (host:port) of sandboxd's /metrics, /healthz and /readyz.")
	fs.StringVar(&o.cfg.MemoryOvercommit, "memory-overcommit", system.DefaultMemoryOvercommit, "How far the sandboxes' memory may exceed the machine's (sandboxd --memory-overcommit): "+
		"8 holds 16 default sandboxes (512 MiB each) per GiB; empty: sandboxd's default, 1. CPU is not admitted (sandboxd's default).")
	fs.StringVar(&o.cfg.Runtime, "runtime", "native", "sandboxd's runtime: native or gvisor.")
	fs.StringVar(&o.cfg.RunscPath, "runsc", "", "With --runtime gvisor only: the runsc binary (make runsc builds one); empty: sandboxd's default, runsc in PATH.")
	fs.StringVar(&o.cfg.NFTTable, "nft-table", "skiff_up", "sandboxd's nftables table (sandboxd --nft-table), deleted on stop once the sandboxes are killed.")
	fs.StringVar(&o.cfg.CgroupParent, "cgroup-parent", "skiff-up", "sandboxd's cgroup for the sandboxes (sandboxd --cgroup-parent), removed on stop once the sandboxes are killed.")
	fs.StringVar(&o.cfg.IfacePrefix, "iface-prefix", "skup", "Start of the host-side names of the sandboxes' veths (sandboxd --iface-prefix).")
	fs.StringVar(&o.cfg.SandboxCIDR, "sandbox-cidr", "10.203.0.0/16", "The sandboxes' IPv4 address pool (sandboxd --sandbox-cidr).")
	fs.Float64Var(&o.cfg.CreateRatePerTeam, "create-rate-per-team", system.DefaultCreateRatePerTeam, "Creates per second one team may make "+
		"(sandbox-apiserver --create-rate-per-team); 0: no limit; not negative.")
	fs.IntVar(&o.cfg.CreateBurstPerTeam, "create-burst-per-team", system.DefaultCreateBurstPerTeam, "Creates one team may make at once above its rate "+
		"(sandbox-apiserver --create-burst-per-team); 0 is passed as 1; not negative.")
	fs.IntVar(&o.cfg.MaxSandboxesPerTeam, "max-sandboxes-per-team", system.DefaultMaxSandboxesPerTeam, "Most sandboxes, running and paused, one team may have "+
		"(sandbox-apiserver --max-sandboxes-per-team); 0: no limit; not negative.")
	fs.StringVar(&o.cfg.Domain, "domain", "", "Domain mode: also serve https://api.<domain> and https://<port>-<sandboxID>.<domain> on loopback, with a certificate of a local CA kept in "+
		"<state-dir>/domain, and print E2B_DOMAIN instead of E2B_API_URL and E2B_SANDBOX_URL, so that presigned file URLs and getHost work (skiff.localhost: "+
		"*.localhost must resolve to loopback, as with systemd-resolved or libnss-myhostname); empty: off.")
	fs.StringVar(&o.cfg.DomainPort, "domain-port", "443", "With --domain: the loopback port it is served on; another than 443 is part of E2B_DOMAIN (skiff.localhost:8443).")
	fs.StringSliceVar(&o.cfg.WarmPools, "warm-pool", nil, "Warm pools, as template=replicas (base=2), repeated or comma-separated "+
		"(sandbox-apiserver --warm-pool): that many sandboxes are kept started, so that a create claims one in milliseconds; each holds its share of the host as a running one does.")
}

// Validate reports every flag that cannot work, naming it.
func (o *options) Validate() error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	c := &o.cfg
	for flag, addr := range map[string]string{
		"--api-listen": c.APIListen, "--api-admin-listen": c.APIAdmin, "--proxy-listen": c.ProxyListen,
		"--proxy-admin-listen": c.ProxyAdmin, "--sandboxd-listen": c.SandboxdListen, "--sandboxd-admin-listen": c.SandboxdAdmin,
	} {
		if _, _, err := net.SplitHostPort(addr); err != nil {
			add("%s %q: want host:port", flag, addr)
		}
	}
	switch c.Runtime {
	case "native":
		if c.RunscPath != "" {
			add("--runsc is only read with --runtime gvisor")
		}
	case "gvisor":
	default:
		add("--runtime %q: must be native or gvisor", c.Runtime)
	}
	if _, err := netip.ParsePrefix(c.SandboxCIDR); err != nil {
		add("--sandbox-cidr %q: %v", c.SandboxCIDR, err)
	}
	if c.Bin == "" || c.State == "" || c.RunDir == "" {
		add("--bin, --state-dir and --run-dir must not be empty")
	}
	if c.Domain != "" {
		if strings.ContainsAny(c.Domain, ":/ ") || strings.HasPrefix(c.Domain, ".") || strings.HasSuffix(c.Domain, ".") || !strings.Contains(c.Domain, ".") {
			add("--domain %q: want a domain name such as skiff.localhost", c.Domain)
		}
		if p, err := strconv.Atoi(c.DomainPort); err != nil || p < 1 || p > 65535 {
			add("--domain-port %q: want a port", c.DomainPort)
		}
	}
	if c.CreateRatePerTeam < 0 || c.CreateBurstPerTeam < 0 || c.MaxSandboxesPerTeam < 0 {
		add("--create-rate-per-team, --create-burst-per-team and --max-sandboxes-per-team must not be negative")
	}
	return errors.Join(errs...)
}
