package cli

import (
	"os"
	"strings"
	"testing"
	"time"
)

func TestOptionsValidate(t *testing.T) {
	valid := func(o *Options) {
		o.NodeName, o.SandboxdTokenFile, o.KubeletClientCA = "host-a", "/etc/skiff/token", "/etc/kubernetes/ca.crt"
	}
	tests := []struct {
		name string
		mod  func(*Options)
		want []string // substrings of the error; none: valid
	}{
		{"valid", func(*Options) {}, nil},
		{"insecure kubelet API", func(o *Options) { o.KubeletClientCA, o.KubeletNoAuth = "", true }, nil},
		{"no kubelet API", func(o *Options) { o.KubeletListen, o.KubeletClientCA = "", "" }, nil},
		{"no token", func(o *Options) { o.SandboxdTokenFile = "" }, []string{"--sandboxd-token-file is required"}},
		{"bad node name", func(o *Options) { o.NodeName = "Host_A" }, []string{"--node-name"}},
		{"bad node IP", func(o *Options) { o.NodeIP = "host" }, []string{"--node-ip"}},
		{"bad sandboxd", func(o *Options) { o.Sandboxd = "localhost" }, []string{"--sandboxd \"localhost\""}},
		{"bad endpoint", func(o *Options) { o.SandboxdEndpoint = ":27777" }, []string{"--sandboxd-endpoint"}},
		{"publish cadence", func(o *Options) { o.Publish.MinInterval = time.Hour }, []string{"--publish-min-interval"}},
		{"short lease", func(o *Options) { o.LeaseDuration = 2 * time.Second }, []string{"--node-lease-duration"}},
		{"fractional lease", func(o *Options) { o.LeaseDuration = 4500 * time.Millisecond }, []string{"--node-lease-duration"}},
		{"no default timeout", func(o *Options) { o.DefaultTimeout = 0 }, []string{"--default-timeout"}},
		{"no workers", func(o *Options) { o.PodWorkers = 0 }, []string{"--pod-workers"}},
		{"kubelet API without auth", func(o *Options) { o.KubeletClientCA = "" }, []string{"--kubelet-client-ca-file"}},
		{"both auths", func(o *Options) { o.KubeletNoAuth = true }, []string{"exclude each other"}},
		{"half a certificate", func(o *Options) { o.KubeletCertFile = "/x.crt" }, []string{"go together"}},
		{"bad log level", func(o *Options) { o.Log.Level = "loud" }, []string{"--log-level"}},
		{"everything at once", func(o *Options) { o.SandboxdTokenFile, o.PodWorkers, o.Admin.Listen = "", 0, "" },
			[]string{"--sandboxd-token-file", "--pod-workers", "--admin-listen"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := NewOptions()
			valid(o)
			tt.mod(o)
			err := o.Validate()
			if len(tt.want) == 0 {
				if err != nil {
					t.Errorf("Validate() = %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate() = nil, want %q", tt.want)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Validate() = %v, want it to name %q", err, w)
				}
			}
		})
	}
}

func TestEndpointDefaultsToTheNodeIP(t *testing.T) {
	o := NewOptions()
	o.Sandboxd = "127.0.0.1:27777"
	if got := o.endpoint("10.0.0.5"); got != "10.0.0.5:27777" {
		t.Errorf("endpoint = %q", got)
	}
	o.SandboxdEndpoint = "sandbox-host-1.internal:27777"
	if got := o.endpoint("10.0.0.5"); got != "sandbox-host-1.internal:27777" {
		t.Errorf("endpoint = %q", got)
	}
}

// An empty --node-name is this host's name, lowercased, as a kubelet's.
func TestCompleteNamesTheNodeAfterTheHost(t *testing.T) {
	host, err := os.Hostname()
	if err != nil {
		t.Skip(err)
	}
	o := NewOptions()
	if o.NodeName != "" {
		t.Fatalf("default --node-name %q, want empty (filled by Complete)", o.NodeName)
	}
	if err := o.Complete(); err != nil {
		t.Fatal(err)
	}
	if want := strings.ToLower(host); o.NodeName != want {
		t.Errorf("--node-name after Complete = %q, want %q", o.NodeName, want)
	}
	o.NodeName = "host-a"
	if err := o.Complete(); err != nil || o.NodeName != "host-a" {
		t.Errorf("Complete changed a given --node-name: %q, %v", o.NodeName, err)
	}
}
