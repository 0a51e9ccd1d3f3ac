package cli

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/skiff-dev/skiff/shared/daemon"
	"github.com/skiff-dev/skiff/shared/daemon/kubeclient"
	"github.com/skiff-dev/skiff/shared/logflags"
	"github.com/skiff-dev/skiff/shared/publish"
)

// Options are the flags of `vk-sandbox serve`.
type Options struct {
	Kubeconfig        string
	NodeName          string
	NodeIP            string
	Sandboxd          string
	SandboxdEndpoint  string
	SandboxdTokenFile string
	Publish           publish.Options
	LeaseDuration     time.Duration
	DefaultTimeout    time.Duration
	PodWorkers        int
	KubeletListen     string
	KubeletCertFile   string
	KubeletKeyFile    string
	KubeletClientCA   string
	KubeletNoAuth     bool
	Admin             daemon.AdminOptions
	Shutdown          daemon.ShutdownOptions
	CacheSyncTimeout  time.Duration
	Log               logflags.Options
}

// NewOptions returns the defaults.
func NewOptions() *Options {
	return &Options{
		Sandboxd:         "127.0.0.1:27777",
		Publish:          publish.NewOptions(),
		LeaseDuration:    40 * time.Second,
		DefaultTimeout:   time.Hour,
		PodWorkers:       4,
		KubeletListen:    ":10250",
		Admin:            daemon.AdminOptions{Listen: "127.0.0.1:27779"},
		Shutdown:         daemon.ShutdownOptions{Timeout: 10 * time.Second},
		CacheSyncTimeout: 2 * time.Minute,
		Log:              logflags.New(logflags.JSON),
	}
}

// AddFlags registers the flags, each defaulting to o's current value.
func (o *Options) AddFlags(f *pflag.FlagSet) {
	kubeclient.AddKubeconfigFlag(f, &o.Kubeconfig, "")
	f.StringVar(&o.NodeName, "node-name", o.NodeName, "The node's name, a DNS subdomain; must be sandboxd's --node-name (the NodeInventory has the host's name: "+
		"vk-sandbox exits if sandboxd names itself otherwise). Empty: this host's name, lowercased.")
	f.StringVar(&o.NodeIP, "node-ip", o.NodeIP, "The node's InternalIP (pods' hostIP, where the kube-apiserver reaches the kubelet API); "+
		"empty: the first IPv4 address, neither loopback nor link-local, of an interface that is up.")
	f.StringVar(&o.Sandboxd, "sandboxd", o.Sandboxd, "Address (host:port) where vk-sandbox reaches its sandboxd.")
	f.StringVar(&o.SandboxdEndpoint, "sandboxd-endpoint", o.SandboxdEndpoint, "Address (host:port) where the fleet (apiserver, envd proxy) reaches this sandboxd, "+
		"published as the NodeInventory's spec.endpoint; empty: --node-ip with the port of --sandboxd.")
	f.StringVar(&o.SandboxdTokenFile, "sandboxd-token-file", o.SandboxdTokenFile, "File holding the token sandboxd accepts (its --auth-token-file), at least 16 characters; "+
		"with per-host tokens, this host's own (sandbox-apiserver node-token prints it). Required.")
	o.Publish.AddFlags(f)
	f.DurationVar(&o.LeaseDuration, "node-lease-duration", o.LeaseDuration, "Duration of the node's lease, whole seconds and at least 4s, renewed every quarter of it while sandboxd is heard.")
	f.DurationVar(&o.DefaultTimeout, "default-timeout", o.DefaultTimeout, "Lifetime of a pod's sandbox when the pod sets neither activeDeadlineSeconds nor the skiff.dev/timeout annotation; greater than 0.")
	f.IntVar(&o.PodWorkers, "pod-workers", o.PodWorkers, "Pods the pod controller works on at once; at least 1.")
	f.StringVar(&o.KubeletListen, "kubelet-listen", o.KubeletListen, "Address of the kubelet API (HTTPS), which kubectl logs reaches through the kube-apiserver; "+
		"it needs --kubelet-client-ca-file or --kubelet-insecure-no-auth. Empty serves none (the node then advertises port 0).")
	f.StringVar(&o.KubeletCertFile, "kubelet-tls-cert-file", o.KubeletCertFile, "Serving certificate of the kubelet API (PEM); empty: a self-signed one made at start for the node's name and IP.")
	f.StringVar(&o.KubeletKeyFile, "kubelet-tls-key-file", o.KubeletKeyFile, "Key of --kubelet-tls-cert-file (PEM); the two go together.")
	f.StringVar(&o.KubeletClientCA, "kubelet-client-ca-file", o.KubeletClientCA, "CA bundle (PEM) that callers of the kubelet API must present a certificate from "+
		"(the kube-apiserver's --kubelet-client-certificate). With --kubelet-listen, this or --kubelet-insecure-no-auth is required, not both.")
	f.BoolVar(&o.KubeletNoAuth, "kubelet-insecure-no-auth", o.KubeletNoAuth, "Serve the kubelet API to anyone who reaches it (development only); excludes --kubelet-client-ca-file.")
	o.Admin.AddFlags(f, false)
	daemon.AddHelp(f, "admin-listen", "/healthz is 200 while the process serves, /readyz once the node is registered and its pod controller runs.")
	daemon.AddHelp(f, "enable-pprof", "A warning is logged when --admin-listen is not a loopback address.")
	o.Shutdown.AddFlags(f, "On shutdown vk-sandbox writes nothing: the node, its pods and the NodeInventory stay as they are.")
	f.DurationVar(&o.CacheSyncTimeout, "cache-sync-timeout", o.CacheSyncTimeout, "How long serve waits for the first list of this node's pods and of the node before it exits with an error; greater than 0.")
	o.Log.AddFlags(f)
	daemon.AddHelp(f, "log-format", "The lines of client-go and virtual-kubelet are written the same way.")
}

// Complete fills what the flags left to the host: --node-name.
func (o *Options) Complete() error {
	if o.NodeName == "" {
		host, err := os.Hostname()
		if err != nil {
			return fmt.Errorf("--node-name is empty and the host's name is unknown: %w", err)
		}
		o.NodeName = strings.ToLower(host)
	}
	return nil
}

// Validate reports every option that cannot work, naming its flag. Call it
// after Complete.
func (o *Options) Validate() error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if msgs := validation.IsDNS1123Subdomain(o.NodeName); len(msgs) > 0 {
		add("--node-name %q: %s", o.NodeName, strings.Join(msgs, "; "))
	}
	if o.NodeIP != "" {
		if _, err := netip.ParseAddr(o.NodeIP); err != nil {
			add("--node-ip %q: not an IP address", o.NodeIP)
		}
	}
	if _, _, err := net.SplitHostPort(o.Sandboxd); err != nil || o.Sandboxd == "" {
		add("--sandboxd %q: want host:port", o.Sandboxd)
	}
	if o.SandboxdEndpoint != "" {
		if host, _, err := net.SplitHostPort(o.SandboxdEndpoint); err != nil || host == "" {
			add("--sandboxd-endpoint %q: want host:port", o.SandboxdEndpoint)
		}
	}
	if o.SandboxdTokenFile == "" {
		add("--sandboxd-token-file is required")
	}
	if err := o.Publish.Validate(); err != nil {
		errs = append(errs, err)
	}
	if o.LeaseDuration < 4*time.Second || o.LeaseDuration%time.Second != 0 {
		add("--node-lease-duration must be whole seconds and at least 4s, got %s", o.LeaseDuration)
	}
	if o.DefaultTimeout <= 0 {
		add("--default-timeout must be greater than 0, got %s", o.DefaultTimeout)
	}
	if o.PodWorkers < 1 {
		add("--pod-workers must be at least 1, got %d", o.PodWorkers)
	}
	if o.KubeletListen != "" {
		if _, _, err := net.SplitHostPort(o.KubeletListen); err != nil {
			add("--kubelet-listen %q: want [host]:port", o.KubeletListen)
		}
		if o.KubeletClientCA == "" && !o.KubeletNoAuth {
			add("--kubelet-listen needs --kubelet-client-ca-file (callers must present a certificate), or --kubelet-insecure-no-auth")
		}
		if o.KubeletClientCA != "" && o.KubeletNoAuth {
			add("--kubelet-client-ca-file and --kubelet-insecure-no-auth exclude each other")
		}
		if (o.KubeletCertFile == "") != (o.KubeletKeyFile == "") {
			add("--kubelet-tls-cert-file and --kubelet-tls-key-file go together")
		}
	}
	for _, err := range []error{o.Admin.Validate(false, map[string]string{"--kubelet-listen": o.KubeletListen}), o.Shutdown.Validate()} {
		if err != nil {
			errs = append(errs, err)
		}
	}
	if o.CacheSyncTimeout <= 0 {
		add("--cache-sync-timeout must be greater than 0, got %s", o.CacheSyncTimeout)
	}
	if err := o.Log.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// nodeIP is --node-ip, or the first non-loopback IPv4 address of an
// interface that is up.
func (o *Options) nodeIP() (string, error) {
	if o.NodeIP != "" {
		return o.NodeIP, nil
	}
	ifaces, err := net.Interfaces()
	if err != nil {
		return "", fmt.Errorf("list interfaces for the node's address: %w", err)
	}
	for _, iface := range ifaces {
		if iface.Flags&net.FlagUp == 0 || iface.Flags&net.FlagLoopback != 0 {
			continue
		}
		addrs, err := iface.Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && n.IP.IsGlobalUnicast() {
				return n.IP.String(), nil
			}
		}
	}
	return "", errors.New("no IPv4 address to use as the node's: set --node-ip")
}

// endpoint is --sandboxd-endpoint, or ip with --sandboxd's port.
func (o *Options) endpoint(ip string) string {
	if o.SandboxdEndpoint != "" {
		return o.SandboxdEndpoint
	}
	_, port, _ := net.SplitHostPort(o.Sandboxd)
	return net.JoinHostPort(ip, port)
}
