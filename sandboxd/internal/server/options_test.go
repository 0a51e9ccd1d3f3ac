package server

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/skiff-dev/skiff/sandboxd/internal/registry"
)

func TestOptionsValidate(t *testing.T) {
	valid := func() Options {
		o := testOptions()
		o.AuthTokenFile = "/etc/skiff/token"
		return o
	}
	for _, tc := range []struct {
		name string
		mod  func(*Options)
		want string // "" means valid
	}{
		{"defaults with a token", func(*Options) {}, ""},
		{"mTLS", func(o *Options) { o.AuthTokenFile, o.TLSCert, o.TLSKey, o.ClientCA = "", "c", "k", "ca" }, ""},
		{"token over TLS", func(o *Options) { o.TLSCert, o.TLSKey = "c", "k" }, ""},
		{"insecure", func(o *Options) { o.AuthTokenFile, o.InsecureNoAuth = "", true }, ""},
		{"no auth", func(o *Options) { o.AuthTokenFile = "" }, "--auth-token-file"},
		{"TLS without client CA or token", func(o *Options) { o.AuthTokenFile, o.TLSCert, o.TLSKey = "", "c", "k" }, "--insecure-no-auth"},
		{"insecure and token", func(o *Options) { o.InsecureNoAuth = true }, "conflicts"},
		{"cert without key", func(o *Options) { o.TLSCert = "c" }, "--tls-key"},
		{"client CA without cert", func(o *Options) { o.ClientCA = "ca" }, "--client-ca"},
		{"bad listen", func(o *Options) { o.Listen = "nope" }, "--listen"},
		{"bad admin listen", func(o *Options) { o.AdminListen = "" }, "--admin-listen"},
		{"no node name", func(o *Options) { o.NodeName = "" }, "--node-name"},
		{"no sandboxes", func(o *Options) { o.MaxSandboxes = 0 }, "--max-sandboxes"},
		{"no cpu", func(o *Options) { o.CPUCapacity = 0 }, "--cpu-capacity"},
		{"no memory", func(o *Options) { o.MemoryCapacity = -1 }, "--memory-capacity"},
		{"zero overcommit", func(o *Options) { o.Overcommit = 0 }, "--overcommit"},
		{"huge overcommit", func(o *Options) { o.Overcommit = 1000 }, "--overcommit"},
		{"bad cidr", func(o *Options) { o.SandboxCIDR = "10.0.0.0" }, "--sandbox-cidr"},
		{"ipv6 cidr", func(o *Options) { o.SandboxCIDR = "fd00::/64" }, "--sandbox-cidr"},
		{"cidr too small", func(o *Options) { o.SandboxCIDR, o.MaxSandboxes = "10.0.0.0/28", 8 }, "--max-sandboxes"},
		{"no envd", func(o *Options) { o.Envd = "" }, "--envd"},
		{"no ready timeout", func(o *Options) { o.EnvdReadyTimeout = 0 }, "--envd-ready-timeout"},
		{"no max timeout", func(o *Options) { o.MaxTimeout = -time.Second }, "--max-timeout"},
		{"tiny default cpu", func(o *Options) { o.DefaultCPUMilli = 1 }, "--default-cpu"},
		{"tiny default memory", func(o *Options) { o.DefaultMemoryMiB = 1 }, "--default-memory"},
		{"negative default disk", func(o *Options) { o.DefaultDiskMiB = -1 }, "--default-disk"},
		{"no metrics interval", func(o *Options) { o.MetricsInterval = 0 }, "--metrics-interval"},
		{"one sample", func(o *Options) { o.MetricsSamples = 1 }, "--metrics-samples"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := valid()
			tc.mod(&o)
			err := o.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Validate = %v, want nil", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("Validate = %v, want an error naming %s", err, tc.want)
			}
		})
	}
}

func TestOptionsFlags(t *testing.T) {
	o := NewOptions()
	if o.CPUCapacity < 1000 || o.NodeName == "" || o.Listen != ":27777" || o.AdminListen != "127.0.0.1:27778" ||
		o.DefaultCPUMilli != 2000 || o.DefaultMemoryMiB != 512 || o.EnvdReadyTimeout != 10*time.Second || o.MaxTimeout != 24*time.Hour {
		t.Fatalf("defaults = %+v", o)
	}
	fs := pflag.NewFlagSet("sandboxd", pflag.ContinueOnError)
	o.AddFlags(fs)
	if err := fs.Parse([]string{"--cpu-capacity=4000", "--memory-capacity=8192", "--overcommit=1.5", "--max-sandboxes=10", "--insecure-no-auth"}); err != nil {
		t.Fatal(err)
	}
	if got := o.Limits(); got != (registry.Limits{MaxSandboxes: 10, CPUMilli: 6000, MemoryMiB: 12288}) {
		t.Fatalf("Limits = %+v", got)
	}
	if !o.InsecureNoAuth {
		t.Fatal("--insecure-no-auth not parsed")
	}
}

func TestParseMemTotal(t *testing.T) {
	if got := parseMemTotal([]byte("MemFree: 1 kB\nMemTotal:       24683620 kB\n")); got != 24683620/1024 {
		t.Fatalf("MemTotal = %d", got)
	}
	if got := parseMemTotal([]byte("garbage")); got != 0 {
		t.Fatalf("garbage = %d", got)
	}
}

func TestReadToken(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	o := Options{AuthTokenFile: write("ok", "  0123456789abcdef\n")}
	if tok, err := o.ReadToken(); err != nil || tok != "0123456789abcdef" {
		t.Fatalf("ReadToken = %q, %v", tok, err)
	}
	o.AuthTokenFile = write("short", "abc\n")
	if _, err := o.ReadToken(); err == nil {
		t.Fatal("a 3-character token was accepted")
	}
	o.AuthTokenFile = filepath.Join(dir, "missing")
	if _, err := o.ReadToken(); err == nil {
		t.Fatal("a missing token file was accepted")
	}
}
