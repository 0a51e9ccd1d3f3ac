// Package server serves sandboxd's API (package service): the API listener
// with its TLS and node-token check, and the admin listener's /metrics and
// /healthz; it starts and stops the service around them.
package server

import (
	"crypto/tls"
	"errors"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/skiff-dev/skiff/sandboxd/internal/service"
)

// Server serves a service. Build it with New, then Run it.
type Server struct {
	cfg Config
	svc *service.Service
	log *slog.Logger

	token     []byte      // the shared caller token; nil without one
	tlsConfig *tls.Config // nil without TLS
	metrics   *prometheus.Registry
}

// New loads the token and TLS material cfg names and returns the server
// of svc; log defaults to slog.Default(). It refuses to serve with neither
// a token nor a client CA unless cfg.InsecureNoAuth says so.
func New(cfg Config, svc *service.Service, log *slog.Logger) (*Server, error) {
	if cfg.AuthTokenFile == "" && cfg.ClientCA == "" && !cfg.InsecureNoAuth {
		return nil, errors.New("new server: no token file and no client CA, and not InsecureNoAuth")
	}
	if log == nil {
		log = slog.Default()
	}
	s := &Server{cfg: cfg, svc: svc, log: log, metrics: prometheus.NewRegistry()}
	tok, err := readToken(cfg.AuthTokenFile)
	if err != nil {
		return nil, err
	}
	if tok != "" {
		s.token = []byte(tok)
	}
	if s.tlsConfig, err = cfg.serverTLS(); err != nil {
		return nil, err
	}
	s.metrics.MustRegister(svc.Collectors()...)
	s.metrics.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return s, nil
}
