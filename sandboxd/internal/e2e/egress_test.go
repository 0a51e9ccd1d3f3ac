package e2e

import (
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
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/net/dns/dnsmessage"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/skiff-dev/skiff/sandboxd/internal/template"
	sandboxdv1 "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
	"github.com/skiff-dev/skiff/shared/testing/hosttest"
)

// world is what sandboxes reach in the egress tests, all in network
// namespaces of the test: two web servers (HTTP on 80, TLS for any name on
// 443, each answering with its own name, the Host and the SNI), a DNS
// server in the first (whose log says which names reached it), and a web
// server at a private address the operator does not allow.
type world struct {
	web1, web2, far *hosttest.Netns
	// subnet is the web servers' /24, which the operator allows.
	subnet     netip.Prefix
	resolvConf string

	mu      sync.Mutex
	queries []string
}

func newWorld(t *testing.T) *world {
	t.Helper()
	s := hosttest.Subnet()
	w := &world{
		web1: hosttest.NewNetns(t, "ewa", s, 0), web2: hosttest.NewNetns(t, "ewb", s, 1),
		far:    hosttest.NewNetns(t, "ewf", (s+1)%256, 0),
		subnet: netip.MustParsePrefix(fmt.Sprintf("10.250.%d.0/24", s)),
	}
	cert := selfSigned(t)
	for name, ns := range map[string]*hosttest.Netns{"web1": w.web1, "web2": w.web2, "far": w.far} {
		w.serveWeb(t, ns, name, cert)
	}
	names := map[string]string{
		"allowed.test": w.web1.Addr, "other.test": w.web2.Addr, "a.wild.test": w.web1.Addr, "b.c.wild.test": w.web1.Addr, "wild.test": w.web2.Addr,
	}
	w.serveDNS(t, w.web1, names)
	w.resolvConf = filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(w.resolvConf, []byte("nameserver "+w.web1.Addr+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return w
}

// asked reports whether a query for name reached the DNS server.
func (w *world) asked(name string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Contains(w.queries, name)
}

func selfSigned(t *testing.T) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test"}, DNSNames: []string{"*"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// serveWeb serves HTTP on :80 and TLS on :443 in ns: "/" answers
// "<name> host=<Host> sni=<SNI>", "/stream" a line every 100 ms until the
// client goes.
func (w *world) serveWeb(t *testing.T, ns *hosttest.Netns, name string, cert tls.Certificate) {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(rw http.ResponseWriter, r *http.Request) {
		sni := ""
		if r.TLS != nil {
			sni = r.TLS.ServerName
		}
		fmt.Fprintf(rw, "%s host=%s sni=%s\n", name, r.Host, sni)
	})
	mux.HandleFunc("/stream", func(rw http.ResponseWriter, r *http.Request) {
		for i := 0; ; i++ {
			if _, err := fmt.Fprintf(rw, "%s %d\n", name, i); err != nil {
				return
			}
			rw.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	})
	for _, port := range []string{"80", "443"} {
		ln, err := ns.Listen(net.JoinHostPort(ns.Addr, port))
		if err != nil {
			t.Fatal(err)
		}
		if port == "443" {
			ln = tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{cert}})
		}
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		t.Cleanup(func() { _ = srv.Close() })
	}
}

// serveDNS answers A queries for names (name → address) in ns, on UDP and
// TCP port 53, logging every name asked.
func (w *world) serveDNS(t *testing.T, ns *hosttest.Netns, names map[string]string) {
	t.Helper()
	answer := func(q []byte) []byte {
		var p dnsmessage.Parser
		h, err := p.Start(q)
		if err != nil {
			return nil
		}
		qs, err := p.AllQuestions()
		if err != nil || len(qs) != 1 {
			return nil
		}
		name := strings.TrimSuffix(strings.ToLower(qs[0].Name.String()), ".")
		w.mu.Lock()
		w.queries = append(w.queries, name)
		w.mu.Unlock()
		rh := dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true, RecursionDesired: h.RecursionDesired}
		addr, ok := names[name]
		if !ok {
			rh.RCode = dnsmessage.RCodeNameError
		}
		b := dnsmessage.NewBuilder(nil, rh)
		_ = b.StartQuestions()
		_ = b.Question(qs[0])
		if ok && qs[0].Type == dnsmessage.TypeA {
			_ = b.StartAnswers()
			_ = b.AResource(dnsmessage.ResourceHeader{Name: qs[0].Name, Class: dnsmessage.ClassINET, TTL: 5},
				dnsmessage.AResource{A: netip.MustParseAddr(addr).As4()})
		}
		out, _ := b.Finish()
		return out
	}
	pc, err := ns.ListenPacket(net.JoinHostPort(ns.Addr, "53"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pc.Close() })
	go func() {
		buf := make([]byte, 4096)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if a := answer(buf[:n]); a != nil {
				_, _ = pc.WriteTo(a, from)
			}
		}
	}()
	ln, err := ns.Listen(net.JoinHostPort(ns.Addr, "53"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				var n [2]byte
				if _, err := io.ReadFull(c, n[:]); err != nil {
					return
				}
				q := make([]byte, int(n[0])<<8|int(n[1]))
				if _, err := io.ReadFull(c, q); err != nil {
					return
				}
				if a := answer(q); a != nil {
					_, _ = c.Write(append([]byte{byte(len(a) >> 8), byte(len(a))}, a...))
				}
			}()
		}
	}()
}

// curl runs curl in sandbox id and returns its output, or "FAILED <exit>".
func (h *host) curl(t *testing.T, id, token, args string) string {
	t.Helper()
	got := h.mustRun(id, token, "user", "curl -sk --connect-timeout 2 --max-time 4 "+args+" 2>/dev/null; rc=$?; echo; echo \"exit=$rc\"")
	out := strings.TrimSpace(got.Stdout)
	i := strings.LastIndex(out, "exit=")
	if i < 0 {
		return "FAILED ?"
	}
	if code := out[i+5:]; code != "0" {
		return "FAILED " + code
	}
	return strings.TrimSpace(out[:i])
}

// TestEgressRules: e2b's allowOut and denyOut, on both runtimes, against
// servers and a DNS server in namespaces of the test (never an outside
// address): an allowed and a denied address, an allowed name over TLS and
// HTTP (decided by its SNI and Host, dialled by the host's resolution of
// it, so /etc/hosts cannot lead it elsewhere), a refused name that never
// reaches the DNS server, a wildcard, allow over deny, the operator's
// denied ranges under every rule, and UpdateNetwork changing the rules
// while a connection stays open.
func TestEgressRules(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the base template")
	}
	base := func(lib *template.Library) (*template.Template, error) {
		return lib.BuildBase(context.Background(), template.BaseOptions{Progress: io.Discard})
	}
	for _, rt := range []string{"native", "gvisor"} {
		t.Run(rt, func(t *testing.T) {
			w := newWorld(t)
			args := []string{"--allow-cidr", w.subnet.String(), "--resolv-conf", w.resolvConf}
			if rt == "gvisor" {
				args = append(args, "--runtime", "gvisor", "--runsc", os.Getenv("SKIFF_RUNSC"))
			}
			testEgressRules(t, newHostWith(t, base, args...), w)
		})
	}
}

func testEgressRules(t *testing.T, h *host, w *world) {
	ctx := context.Background()
	web1, web2, far := w.web1.Addr, w.web2.Addr, w.far.Addr
	withRules := func(allow, deny []string) (string, string) {
		c := h.create(func(r *sandboxdv1.CreateRequest) { r.Egress = &sandboxdv1.Egress{AllowOut: allow, DenyOut: deny} })
		return c.GetSandbox().GetId(), c.GetEnvdAccessToken()
	}
	expect := func(id, tok, what, args, want string) {
		t.Helper()
		got := h.curl(t, id, tok, args)
		if want == "FAILED" && !strings.HasPrefix(got, "FAILED") || want != "FAILED" && !strings.HasPrefix(got, want) {
			t.Errorf("%s: curl %s = %q, want %q", what, args, got, want)
		}
	}

	// No rules: every allowed destination, none the operator denies.
	id, tok := withRules(nil, nil)
	expect(id, tok, "no rules", "http://"+web2+"/", "web2")
	expect(id, tok, "no rules", "http://"+far+"/", "FAILED")

	// An allowed address among all denied; allow wins over deny.
	id, tok = withRules([]string{web1}, []string{"0.0.0.0/0", web1})
	expect(id, tok, "allowed address", "http://"+web1+"/", "web1")
	expect(id, tok, "allowed address over TLS", "https://"+web1+"/", "web1")
	expect(id, tok, "a denied address", "http://"+web2+"/", "FAILED")
	// A denied address alone.
	id, tok = withRules(nil, []string{web2})
	expect(id, tok, "denied address", "http://"+web2+"/", "FAILED")
	expect(id, tok, "the rest", "http://"+web1+"/", "web1")
	expect(id, tok, "the rest, by name (the resolvers answer a sandbox with rules)", "http://allowed.test/", "web1")

	// Names: allowed over TLS and HTTP, refused, and a wildcard.
	id, tok = withRules([]string{"allowed.test", "*.wild.test"}, []string{"0.0.0.0/0"})
	expect(id, tok, "allowed name, TLS", "https://allowed.test/", "web1 host=allowed.test sni=allowed.test")
	expect(id, tok, "allowed name, HTTP", "http://allowed.test/", "web1 host=allowed.test")
	expect(id, tok, "wildcard", "https://a.wild.test/", "web1 host=a.wild.test")
	expect(id, tok, "wildcard, deeper", "https://b.c.wild.test/", "web1")
	expect(id, tok, "the wildcard's apex", "https://wild.test/", "FAILED")
	expect(id, tok, "a refused name", "https://other.test/", "FAILED")
	if w.asked("other.test") || w.asked("wild.test") {
		t.Error("a refused name reached the DNS server: DNS could carry what the rules refuse")
	}
	if !w.asked("allowed.test") {
		t.Error("the allowed name was never asked of the host's resolver")
	}
	// The sandbox's own idea of a name's address does not lead it
	// elsewhere: the host resolves the allowed name.
	expect(id, tok, "an allowed name pinned to another address", "--resolve allowed.test:443:"+web2+" https://allowed.test/", "web1")
	// A refused name at an address the rules deny, and an address with
	// no name.
	expect(id, tok, "a refused name pinned", "--resolve other.test:443:"+web2+" https://other.test/", "FAILED")
	expect(id, tok, "an address without a name", "https://"+web1+"/", "FAILED")

	// The operator's denied ranges stay under every rule.
	id, tok = withRules([]string{"10.0.0.0/8"}, []string{"0.0.0.0/0"})
	expect(id, tok, "allowOut of 10/8, operator-denied address", "http://"+far+"/", "FAILED")
	expect(id, tok, "allowOut of 10/8, operator-allowed address", "http://"+web1+"/", "web1")

	// UpdateNetwork while a connection is open: the stream goes on, new
	// connections follow the new rules; omitted rules clear.
	id, tok = withRules(nil, nil)
	h.mustRun(id, tok, "user", "setsid curl -sN http://"+web2+"/stream > /tmp/stream 2>/dev/null < /dev/null &")
	grows := func() bool {
		before := h.mustRun(id, tok, "user", "wc -l < /tmp/stream").Stdout
		time.Sleep(400 * time.Millisecond)
		return h.mustRun(id, tok, "user", "wc -l < /tmp/stream").Stdout != before
	}
	waitFor(t, 10*time.Second, "the stream to start", grows)
	update := func(allow, deny []string) {
		t.Helper()
		if _, err := h.api.UpdateNetwork(ctx, connect.NewRequest(&sandboxdv1.UpdateNetworkRequest{
			SandboxId: id, Team: "team-a", Egress: &sandboxdv1.Egress{AllowOut: allow, DenyOut: deny},
		})); err != nil {
			t.Fatalf("update network: %v", err)
		}
	}
	update([]string{web1}, []string{"0.0.0.0/0"})
	expect(id, tok, "after the update, a denied address", "http://"+web2+"/", "FAILED")
	expect(id, tok, "after the update, the allowed one", "http://"+web1+"/", "web1")
	if !grows() {
		t.Error("the open connection was cut by the update")
	}
	update(nil, nil)
	expect(id, tok, "after clearing", "http://"+web2+"/", "web2")
	// Internet access off, as e2b's allow_internet_access: all denied but
	// what allowOut allows; and on again.
	internet := func(on bool, allow []string) {
		t.Helper()
		if _, err := h.api.UpdateNetwork(ctx, connect.NewRequest(&sandboxdv1.UpdateNetworkRequest{
			SandboxId: id, Team: "team-a", Egress: &sandboxdv1.Egress{AllowOut: allow}, AllowInternetAccess: &on,
		})); err != nil {
			t.Fatalf("update network: %v", err)
		}
	}
	internet(false, []string{web1})
	expect(id, tok, "internet off, allowed", "http://"+web1+"/", "web1")
	expect(id, tok, "internet off", "http://"+web2+"/", "FAILED")
	internet(false, nil)
	expect(id, tok, "internet off, nothing allowed", "http://"+web1+"/", "FAILED")
	internet(true, nil)
	expect(id, tok, "internet on again", "http://"+web2+"/", "web2")
	got, err := h.api.Get(ctx, connect.NewRequest(&sandboxdv1.GetRequest{SandboxId: id}))
	if err != nil || len(got.Msg.GetSandbox().GetEgress().GetAllowOut()) != 0 {
		t.Errorf("after clearing, the record: %v %v", got, err)
	}
	// Another team's sandbox, and a bad rule.
	if _, err := h.api.UpdateNetwork(ctx, connect.NewRequest(&sandboxdv1.UpdateNetworkRequest{SandboxId: id, Team: "team-b"})); code(err) != connect.CodeNotFound {
		t.Errorf("team-b's update: %v", err)
	}
	_, err = h.api.UpdateNetwork(ctx, connect.NewRequest(&sandboxdv1.UpdateNetworkRequest{SandboxId: id, Team: "team-a", Egress: &sandboxdv1.Egress{DenyOut: []string{"example.com"}}}))
	if code(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "invalid denied CIDR example.com") {
		t.Errorf("a bad rule: %v", err)
	}

	// The rules survive a pause and kill -9 of sandboxd.
	id, tok = withRules([]string{web1}, []string{"0.0.0.0/0"})
	if _, err := h.api.Pause(ctx, connect.NewRequest(&sandboxdv1.PauseRequest{SandboxId: id})); err != nil {
		t.Fatal(err)
	}
	if _, err := h.api.Resume(ctx, connect.NewRequest(&sandboxdv1.ResumeRequest{SandboxId: id})); err != nil {
		t.Fatal(err)
	}
	expect(id, tok, "after a pause, a denied address", "http://"+web2+"/", "FAILED")
	expect(id, tok, "after a pause, the allowed one", "http://"+web1+"/", "web1")
	// A fork has its source's rules.
	fork, err := h.api.Fork(ctx, connect.NewRequest(&sandboxdv1.ForkRequest{SandboxId: id, Team: "team-a", Count: 1, Timeout: durationpb.New(time.Minute)}))
	if err != nil || len(fork.Msg.GetForks()) != 1 || fork.Msg.GetForks()[0].GetCreated() == nil {
		t.Fatalf("fork: %v %v", fork, err)
	}
	f := fork.Msg.GetForks()[0].GetCreated()
	expect(f.GetSandbox().GetId(), f.GetEnvdAccessToken(), "a fork, a denied address", "http://"+web2+"/", "FAILED")
	expect(f.GetSandbox().GetId(), f.GetEnvdAccessToken(), "a fork, the allowed one", "http://"+web1+"/", "web1")
	h.kill9()
	h.start()
	expect(id, tok, "after kill -9, a denied address", "http://"+web2+"/", "FAILED")
	expect(id, tok, "after kill -9, the allowed one", "http://"+web1+"/", "web1")
}
