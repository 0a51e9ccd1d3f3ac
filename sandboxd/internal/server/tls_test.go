package server

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	pb "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
	"github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1/sandboxdv1connect"
)

// testPKI is a CA with a server and a client certificate, as PEM files.
type testPKI struct {
	dir                       string
	caFile, certFile, keyFile string
	pool                      *x509.CertPool
	client                    tls.Certificate
}

func newTestPKI(t *testing.T) *testPKI {
	t.Helper()
	dir := t.TempDir()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	issue := func(serial int64, usage x509.ExtKeyUsage) ([]byte, *ecdsa.PrivateKey) {
		key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "test"},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			ExtKeyUsage: []x509.ExtKeyUsage{usage}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		return der, key
	}
	writePEM := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	p := &testPKI{dir: dir, pool: x509.NewCertPool()}
	p.pool.AddCert(ca)
	p.caFile = writePEM("ca.pem", "CERTIFICATE", caDER)
	srvDER, srvKey := issue(2, x509.ExtKeyUsageServerAuth)
	p.certFile = writePEM("server.pem", "CERTIFICATE", srvDER)
	keyDER, _ := x509.MarshalECPrivateKey(srvKey)
	p.keyFile = writePEM("server-key.pem", "EC PRIVATE KEY", keyDER)
	cliDER, cliKey := issue(3, x509.ExtKeyUsageClientAuth)
	p.client = tls.Certificate{Certificate: [][]byte{cliDER}, PrivateKey: cliKey}
	return p
}

// TestMTLS: with --client-ca, a caller with a certificate the CA signed
// needs no token, and one without a certificate is refused.
func TestMTLS(t *testing.T) {
	pki := newTestPKI(t)
	h := newHarness(t, harnessConfig{cfg: func(c *Config) {
		c.AuthTokenFile, c.TLSCert, c.TLSKey, c.ClientCA = "", pki.certFile, pki.keyFile, pki.caFile
	}})
	url := strings.Replace(h.url, "http://", "https://", 1)
	client := func(certs ...tls.Certificate) *http.Client {
		tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pki.pool, Certificates: certs, MinVersion: tls.VersionTLS12}, ForceAttemptHTTP2: true}
		t.Cleanup(tr.CloseIdleConnections)
		return &http.Client{Transport: tr}
	}
	c := sandboxdv1connect.NewSandboxdServiceClient(client(pki.client), url)
	if _, err := c.Info(t.Context(), connect.NewRequest(&pb.InfoRequest{})); err != nil {
		t.Fatalf("Info with a client certificate: %v", err)
	}
	// Streams work over TLS (HTTP/2).
	stream, err := c.Watch(t.Context(), connect.NewRequest(&pb.WatchRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if !stream.Receive() || stream.Msg().GetSnapshot() == nil {
		t.Fatalf("no snapshot: %v", stream.Err())
	}
	_ = stream.Close()

	_, err = sandboxdv1connect.NewSandboxdServiceClient(client(), url).Info(t.Context(), connect.NewRequest(&pb.InfoRequest{}))
	if err == nil {
		t.Fatal("a caller without a client certificate got in")
	}
}
