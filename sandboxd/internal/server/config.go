package server

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/skiff-dev/skiff/shared/daemon"
	"github.com/skiff-dev/skiff/shared/nodetoken"
)

// Config is what the server is told: where to listen, how callers
// authenticate, how long shutdown may take. Its errors name the flags of
// `sandboxd serve` that set each field.
type Config struct {
	// Listen is the API and relay address (the NodeInventory endpoint).
	Listen string
	// Admin is where /metrics, /healthz and /readyz are served (keep it
	// off the network), and whether pprof is.
	Admin daemon.AdminOptions

	// AuthTokenFile holds the token every caller must present.
	AuthTokenFile string
	// TLSCert and TLSKey serve TLS; with ClientCA, callers must present a
	// certificate it signed (mTLS) and need no token.
	TLSCert  string
	TLSKey   string
	ClientCA string
	// InsecureNoAuth must be set to serve with neither a token nor a
	// client CA.
	InsecureNoAuth bool

	// ShutdownTimeout bounds the graceful stop of the listeners. Sandboxes
	// keep running through it: they are not sandboxd's children.
	ShutdownTimeout time.Duration
}

// readToken reads the shared token from path (--auth-token-file): at
// least 16 characters, surrounding white space not part of it. It returns
// "" for no path.
func readToken(path string) (string, error) {
	if path == "" {
		return "", nil
	}
	return nodetoken.ReadTokenFile("--auth-token-file", path)
}

// serverTLS is the listener's TLS configuration: nil without a
// certificate; with a client CA, callers must present a certificate it
// signed.
func (c *Config) serverTLS() (*tls.Config, error) {
	if c.TLSCert == "" {
		if c.ClientCA != "" {
			return nil, errors.New("--client-ca needs --tls-cert and --tls-key")
		}
		return nil, nil
	}
	cert, err := tls.LoadX509KeyPair(c.TLSCert, c.TLSKey)
	if err != nil {
		return nil, fmt.Errorf("load --tls-cert and --tls-key: %w", err)
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}
	if c.ClientCA != "" {
		pem, err := os.ReadFile(c.ClientCA)
		if err != nil {
			return nil, fmt.Errorf("read --client-ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--client-ca %s holds no PEM certificate", c.ClientCA)
		}
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}
