package vknode

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"time"
)

// KubeletTLS is how the kubelet API serves: its certificate, and whom it
// lets in.
type KubeletTLS struct {
	// CertFile and KeyFile are the serving certificate; empty: a
	// self-signed one made at start for the node's name and address (the
	// kube-apiserver checks a kubelet's certificate only with its
	// --kubelet-certificate-authority).
	CertFile, KeyFile string
	// ClientCAFile: callers (the kube-apiserver, with its
	// --kubelet-client-certificate) must present a certificate that chains
	// to it.
	ClientCAFile string
	// InsecureNoAuth serves anyone who reaches the port (development only).
	InsecureNoAuth bool
}

// Config returns the server's TLS configuration for a node named name at
// ip.
func (k KubeletTLS) Config(name, ip string) (*tls.Config, error) {
	if k.ClientCAFile == "" && !k.InsecureNoAuth {
		return nil, errors.New("the kubelet API needs --kubelet-client-ca-file (or --kubelet-insecure-no-auth)")
	}
	var cert tls.Certificate
	var err error
	if k.CertFile != "" {
		cert, err = tls.LoadX509KeyPair(k.CertFile, k.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("load the kubelet API's certificate: %w", err)
		}
	} else if cert, err = selfSigned(name, ip); err != nil {
		return nil, err
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}
	if k.ClientCAFile != "" {
		data, err := os.ReadFile(k.ClientCAFile)
		if err != nil {
			return nil, fmt.Errorf("read --kubelet-client-ca-file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(data) {
			return nil, fmt.Errorf("--kubelet-client-ca-file %s holds no PEM certificate", k.ClientCAFile)
		}
		cfg.ClientCAs, cfg.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}

// selfSigned makes a serving certificate for name and ip, valid a year.
func selfSigned(name, ip string) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("generate the kubelet API's key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("generate a serial number: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "system:node:" + name},
		DNSNames:     []string{name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	if addr := net.ParseIP(ip); addr != nil {
		tmpl.IPAddresses = []net.IP{addr}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("self-sign the kubelet API's certificate: %w", err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}
