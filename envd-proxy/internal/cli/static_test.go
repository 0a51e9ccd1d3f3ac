package cli

import (
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/skiff-dev/skiff/shared/nodetoken"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// klog's flush daemon, started by client-go's import, lives as long
		// as the process.
		goleak.IgnoreTopFunction("k8s.io/klog/v2.(*flushDaemon).run.func1"),
	)
}

// testLogger logs into the test's output.
func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// Single-host mode: the proxy follows two sandboxd hosts over their Watch
// streams, routes each sandbox to its host with the node token, and drops a
// host whose stream ends. A host that is down does not keep it from being
// ready.
func TestStaticModeRoutesToFollowedHosts(t *testing.T) {
	a, b := newStandin(t, "host-a"), newStandin(t, "host-b")
	idA, idB := a.newSandbox(t), b.newSandbox(t)
	down, err := net.Listen("tcp", "127.0.0.1:0") // a third host, not answering
	if err != nil {
		t.Fatal(err)
	}
	downAddr := down.Addr().String()
	_ = down.Close()

	o := NewOptions()
	o.Sandboxd = []string{a.endpoint(), b.endpoint(), downAddr}
	o.IndexRefresh = 50 * time.Millisecond
	p := startProxy(t, o)

	for _, tc := range []struct {
		id   string
		host *standin
	}{{idA, a}, {idB, b}} {
		code, body := p.send(t, tc.id)
		if code != http.StatusOK || body != "relayed by "+tc.host.node+" to "+tc.id+":49983" {
			t.Fatalf("%s: %d %q", tc.id, code, body)
		}
	}
	if code, body := p.send(t, strings.Repeat("a", 16)+"zzzz"); code != http.StatusBadGateway {
		t.Fatalf("unknown sandbox: %d %q", code, body)
	}

	// host-b's stream ends: it leaves the fleet, and its sandboxes 502
	// without a connection to it.
	b.stopWatching()
	waitFor(t, "host-b's sandbox answers 502", func() bool { code, _ := p.send(t, idB); return code == http.StatusBadGateway })
	// (Connections are not counted here: the mirror keeps calling Info on
	// the same port to reconnect; the kube-mode test counts them.)
	relayed := b.relayed.Load()
	for range 5 {
		if code, _ := p.send(t, idB); code != http.StatusBadGateway {
			t.Fatalf("host-b's sandbox after it left: %d", code)
		}
	}
	if b.relayed.Load() != relayed {
		t.Fatalf("a gone host was sent traffic: relayed %d→%d", relayed, b.relayed.Load())
	}
	if code, _ := p.send(t, idA); code != http.StatusOK {
		t.Fatalf("host-a after host-b left: %d", code)
	}
}

func TestValidate(t *testing.T) {
	valid := func() Options {
		o := NewOptions()
		o.Sandboxd = []string{"127.0.0.1:27777"}
		o.NodeTokens.TokenFile = "/etc/skiff/token"
		return o
	}
	for _, tc := range []struct {
		name   string
		change func(*Options)
		want   string // part of the error; "" for valid
	}{
		{"defaults plus a host and a token", func(*Options) {}, ""},
		{"kube", func(o *Options) { o.Inventory, o.Sandboxd, o.Kubeconfig = "kube", nil, "/kubeconfig" }, ""},
		{"tls", func(o *Options) { o.TLSCert, o.TLSKey = "c.pem", "k.pem" }, ""},
		{"token routing off", func(o *Options) { o.TokenRoutes = 0 }, ""},
		{"bad listen", func(o *Options) { o.Listen = "3002" }, "--listen"},
		{"bad admin listen", func(o *Options) { o.Admin.Listen = "" }, "--admin-listen"},
		{"unknown inventory", func(o *Options) { o.Inventory = "consul" }, "--inventory"},
		{"static without hosts", func(o *Options) { o.Sandboxd = nil }, "--sandboxd"},
		{"static with a bad host", func(o *Options) { o.Sandboxd = []string{"host-without-port"} }, "--sandboxd"},
		{"static with kubeconfig", func(o *Options) { o.Kubeconfig = "/k" }, "--kubeconfig"},
		{"kube with hosts", func(o *Options) { o.Inventory = "kube" }, "--sandboxd"},
		{"kube with a zero window", func(o *Options) { o.Inventory, o.Sandboxd, o.Stale.StaleAfter = "kube", nil, 0 }, "--inventory-stale-after"},
		{"no token file", func(o *Options) { o.NodeTokens.TokenFile = "" }, "--sandboxd-token-file is required"},
		{"kube with a token per host", func(o *Options) {
			o.Inventory, o.Sandboxd, o.NodeTokens = "kube", nil, nodetoken.Options{KeyFile: "/key"}
		}, ""},
		{"kube with a token and a key", func(o *Options) { o.Inventory, o.Sandboxd, o.NodeTokens.KeyFile = "kube", nil, "/key" }, "exclude each other"},
		{"kube without a token", func(o *Options) { o.Inventory, o.Sandboxd, o.NodeTokens.TokenFile = "kube", nil, "" }, "--node-token-key-file"},
		{"static with a key", func(o *Options) { o.NodeTokens = nodetoken.Options{KeyFile: "/key"} }, "--node-token-key-file is only read with --inventory kube"},
		{"cert without key", func(o *Options) { o.TLSCert = "c.pem" }, "--tls-key"},
		{"zero idle timeout", func(o *Options) { o.IdleTimeout = 0 }, "--idle-timeout"},
		{"negative shutdown timeout", func(o *Options) { o.Shutdown.Timeout = -1 }, "--shutdown-timeout"},
		{"negative token routes", func(o *Options) { o.TokenRoutes = -1 }, "--token-routes"},
		{"body idle timeout and connection cap off", func(o *Options) { o.BodyIdleTimeout, o.MaxConnsPerClient = 0, 0 }, ""},
		{"negative body idle timeout", func(o *Options) { o.BodyIdleTimeout = -1 }, "--body-idle-timeout"},
		{"negative connection cap", func(o *Options) { o.MaxConnsPerClient = -1 }, "--max-conns-per-client"},
		{"trusted proxies", func(o *Options) {
			o.TrustedProxies = []string{"10.0.0.0/8", " 192.168.1.7", "fd00::/8", "::ffff:10.1.2.3"}
		}, ""},
		{"a trusted proxy that is no address", func(o *Options) { o.TrustedProxies = []string{"10.0.0.0/8", "ingress.local"} }, `--trusted-proxies: "ingress.local"`},
		{"a trusted IPv4-mapped CIDR", func(o *Options) { o.TrustedProxies = []string{"::ffff:10.0.0.0/104"} }, "as an IPv4 CIDR"},
		{"trusted proxies without a cap", func(o *Options) { o.TrustedProxies, o.MaxConnsPerClient = []string{"10.0.0.0/8"}, 0 }, "--max-conns-per-client is 0"},
		{"zero index refresh", func(o *Options) { o.IndexRefresh = 0 }, "--index-refresh-interval"},
		{"negative gone-node grace", func(o *Options) { o.GoneNodeGrace = -time.Second }, "--gone-node-grace"},
		{"debug logs as JSON", func(o *Options) { o.Log.Level, o.Log.Format = "debug", "json" }, ""},
		{"unknown log level", func(o *Options) { o.Log.Level = "loud" }, "--log-level"},
		{"unknown log format", func(o *Options) { o.Log.Format = "xml" }, "--log-format"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := valid()
			tc.change(&o)
			err := o.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Validate = %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("Validate = %v, want an error naming %s", err, tc.want)
			}
		})
	}
	// Every problem is reported at once.
	o := valid()
	o.Listen, o.TokenRoutes, o.NodeTokens.TokenFile = "x", -1, ""
	if err := o.Validate(); err == nil || strings.Count(err.Error(), "\n") < 2 {
		t.Fatalf("Validate joined %v", err)
	}
}

func TestFlagsRegisterEveryOption(t *testing.T) {
	cmd := NewCommand()
	serve, _, err := cmd.Find([]string{"serve"})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"listen", "admin-listen", "inventory", "sandboxd", "sandboxd-token-file", "node-token-key-file", "kubeconfig",
		"inventory-stale-after", "tls-cert", "tls-key", "idle-timeout", "shutdown-timeout", "token-routes", "index-refresh-interval", "log-level", "log-format",
		"body-idle-timeout", "max-conns-per-client", "trusted-proxies", "gone-node-grace"} {
		if serve.Flags().Lookup(name) == nil {
			t.Errorf("serve has no --%s", name)
		}
	}
	for flag, want := range map[string]string{"idle-timeout": "10m20s", "body-idle-timeout": "2m0s", "max-conns-per-client": "1024"} {
		if f := serve.Flags().Lookup(flag); f.DefValue != want {
			t.Errorf("--%s defaults to %s, want %s", flag, f.DefValue, want)
		}
	}
	cmd.SetArgs([]string{"serve", "--sandboxd-token-file", "/nonexistent", "--sandboxd", "127.0.0.1:1", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"})
	if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), "--sandboxd-token-file") {
		t.Fatalf("serve with an unreadable token file: %v", err)
	}
}

// --trusted-proxies takes CIDRs and addresses (each its own prefix),
// IPv4-mapped IPv6 as IPv4.
func TestTrustedProxiesParsed(t *testing.T) {
	o := Options{TrustedProxies: []string{"10.1.2.3/8", "192.168.1.7", "::ffff:172.16.0.1", "fd00::1/64"}}
	got, err := o.trustedProxies()
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"10.0.0.0/8", "192.168.1.7/32", "172.16.0.1/32", "fd00::/64"}
	if len(got) != len(want) {
		t.Fatalf("parsed %v, want %v", got, want)
	}
	for i := range want {
		if got[i].String() != want[i] {
			t.Errorf("prefix %d: %s, want %s", i, got[i], want[i])
		}
	}
}
