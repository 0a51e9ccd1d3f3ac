package server

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/skiff-dev/skiff/api/v1beta1"
	"github.com/skiff-dev/skiff/envd-proxy/internal/fleet"
	"github.com/skiff-dev/skiff/envd-proxy/internal/proxy"
	"github.com/skiff-dev/skiff/envd-proxy/internal/route"
	"github.com/skiff-dev/skiff/shared/inventory"
	"github.com/skiff-dev/skiff/shared/sandboxid"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// running is a Serve in a goroutine.
type running struct {
	addr, admin string
	stop        context.CancelFunc
	done        chan error
}

func start(t *testing.T, cfg Config) *running {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	adminLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{addr: ln.Addr().String(), admin: adminLn.Addr().String(), stop: cancel, done: make(chan error, 1)}
	go func() { r.done <- Serve(ctx, cfg, ln, adminLn) }()
	t.Cleanup(func() {
		cancel()
		if err := <-r.done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return r
}

// proxyTo returns the real proxy over one stand-in sandboxd running h,
// and a sandbox ID on it.
func proxyTo(t *testing.T, h http.Handler) (http.Handler, string) {
	t.Helper()
	p, id := proxyWith(t, h, proxy.Config{})
	return p, id
}

// proxyWith is proxyTo with cfg's other fields (BodyIdleTimeout, …), and
// returns the *proxy.Proxy.
func proxyWith(t *testing.T, h http.Handler, cfg proxy.Config) (*proxy.Proxy, string) {
	t.Helper()
	up := httptest.NewServer(h)
	t.Cleanup(up.Close)
	src := inventory.NewStaticSource(&v1beta1.NodeInventory{
		ObjectMeta: metav1.ObjectMeta{Name: "node-a"},
		Spec:       v1beta1.NodeInventorySpec{Endpoint: up.Listener.Addr().String()},
	})
	idx := fleet.New(src, fleet.Options{})
	if err := idx.Refresh(t.Context()); err != nil {
		t.Fatal(err)
	}
	id, err := sandboxid.New(sandboxid.NodeTag("node-a"))
	if err != nil {
		t.Fatal(err)
	}
	tr := proxy.NewTransport(proxy.TransportOptions{}, nil)
	t.Cleanup(tr.CloseIdleConnections)
	cfg.Fleet, cfg.Tokens, cfg.NodeToken, cfg.Transport = idx, route.NewTokens(8), func(string) string { return "node-token-0123456789" }, tr
	return proxy.New(cfg), id
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// waitFor polls cond until it holds; the guard only turns a hang into a
// failure.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("%s: never happened", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// On shutdown the proxy stops accepting and turns not-ready, but a stream
// and an upgraded connection in flight keep going until they end by
// themselves; only then does Serve return.
func TestShutdownDrainsStreamsInFlight(t *testing.T) {
	release := make(chan struct{})
	h, id := proxyTo(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") != "" {
			conn, brw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				return
			}
			defer conn.Close()
			_, _ = brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n")
			_ = brw.Flush()
			_, _ = io.Copy(conn, brw) // echo until the client closes
			return
		}
		_, _ = io.WriteString(w, "first\n")
		_ = http.NewResponseController(w).Flush()
		select {
		case <-release:
			_, _ = io.WriteString(w, "second\n")
		case <-r.Context().Done():
		}
	}))
	srv := start(t, Config{Handler: h, IdleTimeout: time.Minute, ShutdownTimeout: 5 * time.Minute, Registry: prometheus.NewRegistry()})

	// A stream, read up to its first chunk.
	req, _ := http.NewRequest(http.MethodGet, "http://"+srv.addr+"/stream", nil)
	req.Header.Set("E2b-Sandbox-Id", id)
	req.Header.Set("E2b-Sandbox-Port", "49983")
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if line, err := br.ReadString('\n'); err != nil || line != "first\n" {
		t.Fatalf("first chunk: %q, %v", line, err)
	}
	// An upgraded connection.
	ws, err := net.Dial("tcp", srv.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	fmt.Fprintf(ws, "GET /ws HTTP/1.1\r\nHost: 8080-%s.example.com\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n", id)
	wsr := bufio.NewReader(ws)
	up, err := http.ReadResponse(wsr, nil)
	if err != nil {
		t.Fatal(err)
	}
	_ = up.Body.Close() // empty: after a 101 the connection is the stream
	if up.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade answered %d", up.StatusCode)
	}

	srv.stop()
	waitFor(t, "/readyz turns 503", func() bool {
		code, _ := get(t, "http://"+srv.admin+"/readyz")
		return code == http.StatusServiceUnavailable
	})
	waitFor(t, "the listener closes", func() bool {
		c, err := net.Dial("tcp", srv.addr)
		if err == nil {
			_ = c.Close()
		}
		return err != nil
	})

	// Both still work.
	if _, err := io.WriteString(ws, "ping\n"); err != nil {
		t.Fatal(err)
	}
	if line, err := wsr.ReadString('\n'); err != nil || line != "ping\n" {
		t.Fatalf("upgraded connection during the drain: %q, %v", line, err)
	}
	close(release)
	if rest, err := io.ReadAll(br); err != nil || string(rest) != "second\n" {
		t.Fatalf("stream during the drain: %q, %v", rest, err)
	}
	// Once the stream ended, only the upgraded connection holds Serve.
	for range 20 {
		if _, err := io.WriteString(ws, "ping\n"); err != nil {
			t.Fatal(err)
		}
		if line, err := wsr.ReadString('\n'); err != nil || line != "ping\n" {
			t.Fatalf("upgraded connection after the stream ended: %q, %v", line, err)
		}
	}
	select {
	case err := <-srv.done:
		t.Fatalf("Serve returned (%v) while an upgraded connection was open", err)
	default:
	}
	_ = ws.Close()
	select {
	case err := <-srv.done:
		srv.done <- err // for the cleanup
	case <-time.After(time.Minute):
		t.Fatal("Serve did not return after the last connection ended")
	}
}

// What is still open when the shutdown timeout runs out is cut, and the
// request to sandboxd is cancelled.
func TestShutdownCutsWhatOutlastsTheTimeout(t *testing.T) {
	var cancelled atomic.Bool
	h, id := proxyTo(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "first\n")
		_ = http.NewResponseController(w).Flush()
		<-r.Context().Done() // never ends by itself
		cancelled.Store(true)
	}))
	srv := start(t, Config{Handler: h, IdleTimeout: time.Minute, ShutdownTimeout: 100 * time.Millisecond})
	req, _ := http.NewRequest(http.MethodGet, "http://"+srv.addr+"/", nil)
	req.Header.Set("E2b-Sandbox-Id", id)
	req.Header.Set("E2b-Sandbox-Port", "49983")
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if line, _ := br.ReadString('\n'); line != "first\n" {
		t.Fatalf("first chunk %q", line)
	}
	srv.stop()
	err = <-srv.done
	srv.done <- err
	if _, err := io.ReadAll(br); err == nil {
		t.Error("the cut stream ended cleanly")
	}
	waitFor(t, "sandboxd sees the request cancelled", cancelled.Load)
}

func TestAdminEndpoints(t *testing.T) {
	var ready atomic.Bool
	reg := prometheus.NewRegistry()
	reg.MustRegister(prometheus.NewCounter(prometheus.CounterOpts{Name: "skiff_envd_proxy_test_total", Help: "test"}))
	srv := start(t, Config{Handler: http.NotFoundHandler(), IdleTimeout: time.Minute, Registry: reg, Ready: ready.Load})
	if code, _ := get(t, "http://"+srv.admin+"/healthz"); code != http.StatusOK {
		t.Errorf("/healthz = %d", code)
	}
	if code, body := get(t, "http://"+srv.admin+"/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "not synced") {
		t.Errorf("/readyz before sync = %d %q", code, body)
	}
	ready.Store(true)
	if code, _ := get(t, "http://"+srv.admin+"/readyz"); code != http.StatusOK {
		t.Errorf("/readyz after sync = %d", code)
	}
	if code, body := get(t, "http://"+srv.admin+"/metrics"); code != http.StatusOK || !strings.Contains(body, "skiff_envd_proxy_test_total") {
		t.Errorf("/metrics = %d %q", code, body)
	}
}

// With TLS the proxy offers h2 and http/1.1 through ALPN; without it, plain
// HTTP/1.1 (e2b's SDKs never speak h2c).
func TestTLSOffersHTTP2(t *testing.T) {
	cert, pool := selfSigned(t)
	proto := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, r.Proto) })
	srv := start(t, Config{Handler: proto, IdleTimeout: time.Minute,
		TLS: &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}})
	for _, tc := range []struct {
		name      string
		nextProto []string
		want      string
	}{
		{"h2", []string{"h2", "http/1.1"}, "HTTP/2.0"},
		{"http/1.1", []string{"http/1.1"}, "HTTP/1.1"},
	} {
		tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, NextProtos: tc.nextProto, MinVersion: tls.VersionTLS12},
			ForceAttemptHTTP2: len(tc.nextProto) > 1}
		resp, err := (&http.Client{Transport: tr}).Get("https://" + srv.addr + "/")
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		tr.CloseIdleConnections()
		if string(body) != tc.want {
			t.Errorf("%s: served %q", tc.name, body)
		}
	}
	plain := start(t, Config{Handler: proto, IdleTimeout: time.Minute})
	tr := &http.Transport{Protocols: new(http.Protocols)}
	tr.Protocols.SetUnencryptedHTTP2(true)
	resp, err := (&http.Client{Transport: tr}).Get("http://" + plain.addr + "/")
	if err == nil {
		_ = resp.Body.Close()
		t.Error("the plaintext listener spoke h2c")
	}
	tr.CloseIdleConnections()
	if _, body := get(t, "http://"+plain.addr+"/"); body != "HTTP/1.1" {
		t.Errorf("plaintext: %q", body)
	}
}

func selfSigned(t *testing.T) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "proxy"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, DNSNames: []string{"*.sandbox.localhost"},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, pool
}
