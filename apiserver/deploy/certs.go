package deploy

import (
	"time"

	"github.com/skiff-dev/skiff/shared/certs"
)

// Cert is a serving certificate and its key, PEM, and the PEM CA that
// signed it (the APIService's caBundle).
type Cert struct {
	CA, Cert, Key []byte
}

// ServiceDNSNames are the names the aggregator checks the serving
// certificate for (<name>.<namespace>.svc), with the shorter and longer
// forms.
func ServiceDNSNames(c Config) []string {
	c = c.withDefaults()
	base := c.Name + "." + c.Namespace
	return []string{base + ".svc", c.Name, base, base + ".svc.cluster.local"}
}

// ServingCert makes a self-signed CA and a serving certificate signed by
// it, valid for validity from now for the Service's DNS names and for the
// extra names and IPs (localhost and 127.0.0.1 for a replica run outside
// the cluster).
func ServingCert(c Config, validity time.Duration, extra ...string) (*Cert, error) {
	ca, err := certs.NewCA("skiff sandbox-apiserver CA", validity)
	if err != nil {
		return nil, err
	}
	p, err := ca.Serving(validity, append(ServiceDNSNames(c), extra...)...)
	if err != nil {
		return nil, err
	}
	return &Cert{CA: ca.PEM, Cert: p.Cert, Key: p.Key}, nil
}
