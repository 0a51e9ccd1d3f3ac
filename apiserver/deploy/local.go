package deploy

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// InstallLocal installs the objects for a replica that runs outside the
// cluster, on this machine: port is its --secure-port on 127.0.0.1, behind
// an ExternalName Service for localhost (Endpoints cannot name loopback).
// It writes a serving certificate (valid for a day) and its key into dir
// and returns the serve flags that use them. c must know core, RBAC and
// apiregistration types; the namespace is created if missing.
func InstallLocal(ctx context.Context, c client.Client, dir string, port int) ([]string, error) {
	cfg := Config{ExternalName: "localhost", TargetPort: int32(port)}
	flags, err := install(ctx, c, dir, cfg, "localhost", "127.0.0.1")
	if err != nil {
		return nil, err
	}
	return append(flags, "--bind-address", "127.0.0.1"), nil
}

// InstallEndpoints installs the objects for replicas that run outside the
// cluster on addrs (IPv4 addresses of this machine that are not loopback,
// which an EndpointSlice cannot name), each with --secure-port port and
// --bind-address its address, behind a selector-less Service and its
// EndpointSlice: the kube-apiserver must run with
// --enable-aggregator-routing. It writes one serving certificate (valid
// for a day) and its key into dir and returns the serve flags every
// replica shares.
func InstallEndpoints(ctx context.Context, c client.Client, dir string, addrs []string, port int) ([]string, error) {
	return install(ctx, c, dir, Config{Endpoints: addrs, TargetPort: int32(port)}, addrs...)
}

func install(ctx context.Context, c client.Client, dir string, cfg Config, sans ...string) ([]string, error) {
	cert, err := ServingCert(cfg, 24*time.Hour, sans...)
	if err != nil {
		return nil, err
	}
	cfg.CABundle = cert.CA
	certFile, keyFile := filepath.Join(dir, "kubeapi.crt"), filepath.Join(dir, "kubeapi.key")
	for f, data := range map[string][]byte{certFile: cert.Cert, keyFile: cert.Key} {
		if err := os.WriteFile(f, data, 0o600); err != nil {
			return nil, fmt.Errorf("write the serving certificate: %w", err)
		}
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: cfg.withDefaults().Namespace}}
	if err := c.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("create namespace %s: %w", ns.Name, err)
	}
	for _, obj := range Objects(cfg) {
		if err := c.Create(ctx, obj); err != nil {
			return nil, fmt.Errorf("create %T %s: %w", obj, obj.GetName(), err)
		}
	}
	return []string{"--secure-port", strconv.Itoa(int(cfg.TargetPort)), "--tls-cert-file", certFile, "--tls-private-key-file", keyFile}, nil
}
