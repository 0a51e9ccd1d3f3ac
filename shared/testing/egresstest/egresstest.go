// Package egresstest is a small world for tests of sandboxes' outbound
// rules: web servers and a DNS server in network namespaces of the test.
package egresstest

import (
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

	"golang.org/x/net/dns/dnsmessage"

	"github.com/skiff-dev/skiff/shared/testing/hosttest"
)

// World is what sandboxes reach in egress tests, all in network
// namespaces of the test (never an outside address): two web servers (HTTP on 80, TLS for any name on
// 443, each answering with its own name, the Host and the SNI), a DNS
// server in the first (whose log says which names reached it), and a web
// server at a private address the operator does not allow.
type World struct {
	Web1, Web2, Far *hosttest.Netns
	// Subnet is the web servers' /24, which the operator must allow
	// (sandboxd --allow-cidr): it is in a private range.
	Subnet netip.Prefix
	// ResolvConf names the DNS server (sandboxd --resolv-conf).
	ResolvConf string

	mu      sync.Mutex
	queries []string
}

// NewWorld starts a World; the test's cleanup ends it. Names resolve as:
// allowed.test, a.wild.test, b.c.wild.test to Web1; other.test, wild.test
// to Web2.
func NewWorld(t *testing.T) *World {
	t.Helper()
	s := hosttest.Subnet()
	w := &World{
		Web1: hosttest.NewNetns(t, "ewa", s, 0), Web2: hosttest.NewNetns(t, "ewb", s, 1),
		Far:    hosttest.NewNetns(t, "ewf", (s+1)%256, 0),
		Subnet: netip.MustParsePrefix(fmt.Sprintf("10.250.%d.0/24", s)),
	}
	cert := selfSigned(t)
	for name, ns := range map[string]*hosttest.Netns{"web1": w.Web1, "web2": w.Web2, "far": w.Far} {
		w.serveWeb(t, ns, name, cert)
	}
	names := map[string]string{
		"allowed.test": w.Web1.Addr, "other.test": w.Web2.Addr, "a.wild.test": w.Web1.Addr, "b.c.wild.test": w.Web1.Addr, "wild.test": w.Web2.Addr,
	}
	w.serveDNS(t, w.Web1, names)
	w.ResolvConf = filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(w.ResolvConf, []byte("nameserver "+w.Web1.Addr+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return w
}

// Asked reports whether a query for name reached the DNS server.
func (w *World) Asked(name string) bool {
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
// "<name> host=<Host> sni=<SNI>" (name: web1, web2, far), "/stream" a line every 100 ms until the
// client goes.
func (w *World) serveWeb(t *testing.T, ns *hosttest.Netns, name string, cert tls.Certificate) {
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
func (w *World) serveDNS(t *testing.T, ns *hosttest.Netns, names map[string]string) {
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
