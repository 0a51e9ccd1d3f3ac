package system

// Domain mode: the system answers as e2b's cloud does, by name, over TLS.
// The SDK, given only E2B_DOMAIN=<domain>, calls the API at
// https://api.<domain> and envd and the sandboxes' ports at
// https://<port>-<sandboxID>.<domain>: presigned file URLs and getHost
// work, which no single E2B_SANDBOX_URL can give. One listener on loopback
// terminates TLS with a certificate of a local CA (kept in the state
// directory, for NODE_EXTRA_CA_CERTS) and hands api.<domain> to the API and
// every other name to the envd proxy, which routes by the Host header.

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// DomainFiles are the local CA's certificate, alone (NODE_EXTRA_CA_CERTS,
// which adds to Node's own roots) and after the system's roots
// (SSL_CERT_FILE, which Python's SDK reads instead of them).
type DomainFiles struct {
	CA, Bundle string
}

// systemRoots is Debian's bundle of the system's root certificates.
const systemRoots = "/etc/ssl/certs/ca-certificates.crt"

// checkDomainResolves reports whether the names of domain (without a
// port) resolve to this machine's loopback only.
func checkDomainResolves(ctx context.Context, domain string) error {
	for _, name := range []string{"api." + domain, "49983-resolvecheck." + domain} {
		addrs, err := net.DefaultResolver.LookupHost(ctx, name)
		if err == nil && len(addrs) == 0 {
			err = errors.New("no address")
		}
		for _, a := range addrs {
			if ip := net.ParseIP(a); ip == nil || !ip.IsLoopback() {
				err = fmt.Errorf("resolves to %s, not loopback", a)
			}
		}
		if err != nil {
			return fmt.Errorf("domain mode needs api.%[1]s and *.%[1]s to resolve to this machine: %s: %w "+
				"(names under .localhost do with systemd-resolved, or with libnss-myhostname: apt-get install libnss-myhostname)", domain, name, err)
		}
	}
	return nil
}

// domainTLS returns a certificate for api.<domain> and *.<domain>, issued
// now by the local CA in dir (made there, and kept, the first time).
func domainTLS(dir, domain string) (*tls.Certificate, DomainFiles, error) {
	files := DomainFiles{CA: filepath.Join(dir, "ca.pem"), Bundle: filepath.Join(dir, "ca-bundle.pem")}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, files, err
	}
	ca, caKey, err := loadOrMakeCA(files.CA, filepath.Join(dir, "ca-key.pem"))
	if err != nil {
		return nil, files, fmt.Errorf("local CA: %w", err)
	}
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Raw})
	roots, err := os.ReadFile(systemRoots)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, files, err
	}
	if err := os.WriteFile(files.Bundle, append(append(roots, '\n'), caPEM...), 0o644); err != nil {
		return nil, files, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, files, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, files, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "api." + domain},
		DNSNames:     []string{"api." + domain, "*." + domain},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(90 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, files, err
	}
	return &tls.Certificate{Certificate: [][]byte{der, ca.Raw}, PrivateKey: key}, files, nil
}

// loadOrMakeCA reads the CA at certPath and keyPath, or makes one there.
func loadOrMakeCA(certPath, keyPath string) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	certPEM, cerr := os.ReadFile(certPath)
	keyPEM, kerr := os.ReadFile(keyPath)
	if cerr == nil && kerr == nil {
		cb, _ := pem.Decode(certPEM)
		kb, _ := pem.Decode(keyPEM)
		if cb == nil || kb == nil {
			return nil, nil, fmt.Errorf("%s or %s is not PEM: remove both to make a new CA", certPath, keyPath)
		}
		cert, err := x509.ParseCertificate(cb.Bytes)
		if err != nil {
			return nil, nil, err
		}
		key, err := x509.ParseECPrivateKey(kb.Bytes)
		if err != nil {
			return nil, nil, err
		}
		if time.Now().Add(24 * time.Hour).Before(cert.NotAfter) {
			return cert, key, nil
		}
		// Expired or about to: a new one, which clients must trust again.
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, nil, err
	}
	host, _ := os.Hostname()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "Skiff make up local CA (" + host + ")"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(10 * 365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	if err := os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		return nil, nil, err
	}
	if err := os.WriteFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		return nil, nil, err
	}
	return cert, key, nil
}

// front is domain mode's TLS listener.
type front struct {
	servers []*http.Server
}

// startFront serves domain on port of loopback (IPv4 and, where the
// machine has it, IPv6: *.localhost may resolve to either): api.<domain>
// goes to api, every other name to proxy, both plain HTTP on loopback.
func startFront(domain, port string, cert *tls.Certificate, api, proxy string, errLog *log.Logger) (*front, error) {
	apiURL, err := url.Parse("http://" + api)
	if err != nil {
		return nil, err
	}
	proxyURL, err := url.Parse("http://" + proxy)
	if err != nil {
		return nil, err
	}
	apiHost := "api." + domain
	forward := func(to *url.URL) *httputil.ReverseProxy {
		return &httputil.ReverseProxy{
			Rewrite: func(r *httputil.ProxyRequest) {
				r.SetURL(to)
				r.Out.Host = r.In.Host // the proxy routes by it
				r.SetXForwarded()
			},
			FlushInterval: -1, // streams (Connect's server streams) pass at once
			ErrorLog:      errLog,
		}
	}
	toAPI, toProxy := forward(apiURL), forward(proxyURL)
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host := r.Host
		if h, _, err := net.SplitHostPort(host); err == nil {
			host = h
		}
		if strings.EqualFold(host, apiHost) {
			toAPI.ServeHTTP(w, r)
			return
		}
		toProxy.ServeHTTP(w, r)
	})
	f := &front{}
	for _, ip := range []string{"127.0.0.1", "::1"} {
		ln, err := net.Listen("tcp", net.JoinHostPort(ip, port))
		if err != nil {
			if ip == "::1" && isNoIPv6(err) {
				continue
			}
			f.close()
			return nil, fmt.Errorf("domain mode: listen on %s: %w", net.JoinHostPort(ip, port), err)
		}
		srv := &http.Server{
			Handler:           handler,
			TLSConfig:         &tls.Config{Certificates: []tls.Certificate{*cert}, MinVersion: tls.VersionTLS12},
			ReadHeaderTimeout: 20 * time.Second,
			ErrorLog:          errLog,
		}
		f.servers = append(f.servers, srv)
		go func() { _ = srv.ServeTLS(ln, "", "") }()
	}
	return f, nil
}

// isNoIPv6 tells a machine without IPv6 loopback.
func isNoIPv6(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "cannot assign requested address") || strings.Contains(msg, "address family not supported")
}

func (f *front) close() {
	for _, s := range f.servers {
		_ = s.Close()
	}
}

// progressLines writes what it is given to the system's progress, one
// line at a time, behind prefix.
type progressLines struct {
	s      *System
	prefix string
}

func (p *progressLines) Write(b []byte) (int, error) {
	p.s.progressf("%s%s", p.prefix, strings.TrimRight(string(b), "\n"))
	return len(b), nil
}
