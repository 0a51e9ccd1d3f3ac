package e2bapi

import (
	"bytes"
	"errors"
	"log/slog"
	"net/http"
	"path"
	"strings"
	"time"
)

// Config configures the handler New returns.
type Config struct {
	// Backend does the work; required.
	Backend Backend
	// Team reads the caller's team from an authenticated request; false
	// answers 401. Required.
	Team func(*http.Request) (string, bool)
	// SandboxDomain is returned as "domain" (the SDK then builds envd URLs
	// as 49983-<id>.<domain>); empty returns null, meaning the client's
	// own domain.
	SandboxDomain string
	// MaxTimeout is the longest lifetime a create, connect, resume or
	// setTimeout may ask for; zero means DefaultMaxTimeout.
	MaxTimeout time.Duration
	// Logger logs backend failures; nil means slog.Default().
	Logger *slog.Logger
	// VolumeKey signs the volume tokens (nodetoken.VolumeKey), which every
	// replica must share; nil answers the volume routes 501.
	VolumeKey []byte
}

// DefaultMaxTimeout matches sandboxd's --max-timeout default and e2b's Pro
// plan.
const DefaultMaxTimeout = 24 * time.Hour

// Defaults and bounds from e2b's API (docs/e2b-protocol.md §1.2, §1.3, §1.5).
const (
	defaultTimeoutV1      = 15 * time.Second
	defaultTimeoutV2      = 300 * time.Second
	defaultConnectV2      = 300 * time.Second
	defaultResumeTimeout  = 15 * time.Second
	defaultRefresh        = 15 * time.Second
	maxRefresh            = time.Hour
	defaultListLimit      = 100
	maxListLimit          = 100
	maxMetricsSandboxes   = 100
	defaultLogLimit       = 1000
	maxLogLimit           = 1000
	maxLogSearch          = 256
	maxBodyBytes          = 1 << 20
	maxTemplateNameLength = 256
)

type server struct {
	backend    Backend
	team       func(*http.Request) (string, bool)
	domain     *string
	maxTimeout time.Duration
	log        *slog.Logger
	mux        *http.ServeMux
	volumeKey  []byte
}

// New returns the e2b REST API as an http.Handler. It panics if Backend or
// Team is nil: that is a wiring bug, not a runtime condition.
func New(cfg Config) http.Handler {
	if cfg.Backend == nil || cfg.Team == nil {
		panic("e2bapi.New: Backend and Team are required")
	}
	s := &server{
		backend:    cfg.Backend,
		team:       cfg.Team,
		maxTimeout: cfg.MaxTimeout,
		log:        cfg.Logger,
		mux:        http.NewServeMux(),
		volumeKey:  cfg.VolumeKey,
	}
	if cfg.SandboxDomain != "" {
		d := cfg.SandboxDomain
		s.domain = &d
	}
	if s.maxTimeout <= 0 {
		s.maxTimeout = DefaultMaxTimeout
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	s.routes()
	return s
}

// teamHandler is a handler that runs for an authenticated team.
type teamHandler func(w http.ResponseWriter, r *http.Request, team string)

// authed wraps h with the team lookup: 401 in e2b's shape when there is no
// team.
func (s *server) authed(h teamHandler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		team, ok := s.team(r)
		if !ok || team == "" {
			writeError(w, http.StatusUnauthorized, "", "missing or invalid API key (send it as X-API-Key)")
			return
		}
		h(w, r, team)
	}
}

func (s *server) routes() {
	m := s.mux
	m.HandleFunc("GET /health", s.health)

	// Sandboxes (docs/e2b-protocol.md §1.2).
	m.HandleFunc("POST /sandboxes", s.authed(s.create(false)))
	m.HandleFunc("POST /v2/sandboxes", s.authed(s.create(true)))
	m.HandleFunc("GET /sandboxes", s.authed(s.list(false)))
	m.HandleFunc("GET /v2/sandboxes", s.authed(s.list(true)))
	m.HandleFunc("GET /sandboxes/metrics", s.authed(s.metricsMany))
	m.HandleFunc("GET /sandboxes/{id}", s.authed(s.sandboxRoute(s.get)))
	m.HandleFunc("DELETE /sandboxes/{id}", s.authed(s.sandboxRoute(s.kill)))
	m.HandleFunc("POST /sandboxes/{id}/connect", s.authed(s.sandboxRoute(s.connect(false))))
	m.HandleFunc("POST /v2/sandboxes/{id}/connect", s.authed(s.sandboxRoute(s.connect(true))))
	m.HandleFunc("POST /sandboxes/{id}/timeout", s.authed(s.sandboxRoute(s.setTimeout)))
	m.HandleFunc("POST /sandboxes/{id}/refreshes", s.authed(s.sandboxRoute(s.refresh)))
	m.HandleFunc("POST /sandboxes/{id}/pause", s.authed(s.sandboxRoute(s.pause)))
	m.HandleFunc("POST /sandboxes/{id}/resume", s.authed(s.sandboxRoute(s.resume)))
	m.HandleFunc("GET /sandboxes/{id}/metrics", s.authed(s.sandboxRoute(s.metrics)))
	m.HandleFunc("GET /sandboxes/{id}/logs", s.authed(s.sandboxRoute(s.logsV1)))
	m.HandleFunc("GET /v2/sandboxes/{id}/logs", s.authed(s.sandboxRoute(s.logsV2)))
	m.HandleFunc("POST /sandboxes/{id}/snapshots", s.authed(s.sandboxRoute(s.createSnapshot)))
	m.HandleFunc("POST /sandboxes/{id}/fork", s.authed(s.sandboxRoute(s.fork)))
	m.HandleFunc("PUT /sandboxes/{id}/network", s.authed(s.sandboxRoute(s.updateNetwork)))
	m.HandleFunc("GET /snapshots", s.authed(s.listSnapshots))
	m.HandleFunc("DELETE /templates/{templateID}", s.authed(s.deleteTemplate))

	// Templates (docs/e2b-protocol.md §1.6), served from the templates the
	// fleet has.
	m.HandleFunc("GET /templates", s.authed(s.templatesV1))
	m.HandleFunc("GET /v2/templates", s.authed(s.templatesV2))
	m.HandleFunc("GET /templates/{templateID}", s.authed(s.templateWithBuilds))
	// GET /templates/aliases/{alias} and GET /templates/{templateID}/tags
	// overlap ("/templates/aliases/tags") and neither is more specific, so
	// one pattern serves both.
	m.HandleFunc("GET /templates/{templateID}/{sub}", s.authed(s.templateSub))

	if s.volumeKey != nil {
		s.volumeRoutes()
	} else {
		for _, u := range volumeRoutesUnsupported {
			m.HandleFunc(u.Pattern, s.authed(notImplemented(u)))
		}
	}
	for _, u := range unsupportedRoutes {
		if u.Pattern != templateTagsPattern {
			m.HandleFunc(u.Pattern, s.authed(notImplemented(u)))
		}
	}
}

// ServeHTTP answers the mux's own 404 and 405 in e2b's error shape, and
// turns a handler panic into a 500 in that shape.
func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	tw := &trackingWriter{ResponseWriter: w}
	defer func() {
		if v := recover(); v != nil {
			if v == http.ErrAbortHandler { //nolint:errorlint // the sentinel is panicked as is, never wrapped
				panic(v)
			}
			s.log.ErrorContext(r.Context(), "handler panicked", "method", r.Method, "path", r.URL.Path, "panic", v)
			if !tw.wrote {
				writeError(tw, http.StatusInternalServerError, codeInternal, "internal server error")
			}
		}
	}()
	// The mux would redirect a path that is not clean ("/a/../b", "//a");
	// no SDK sends one, so it is a route that does not exist.
	if p := r.URL.Path; p != cleanPath(p) {
		writeError(tw, http.StatusNotFound, "", "no route %s %s", r.Method, echo(p))
		return
	}
	if _, pattern := s.mux.Handler(r); pattern == "" {
		s.noRoute(tw, r)
		return
	}
	s.mux.ServeHTTP(tw, r)
}

// RoutePattern returns the pattern of the route r matches ("POST
// /v2/sandboxes"), or "" when it matches none. Metrics label requests with
// it: unlike the path it never holds a sandbox ID, so the set is bounded.
// It reads nothing but r's method, host and path.
func (s *server) RoutePattern(r *http.Request) string {
	if p := r.URL.Path; p != cleanPath(p) {
		return ""
	}
	_, pattern := s.mux.Handler(r)
	// Every route names its method; a pattern without one is the mux's
	// redirect target, built from the caller's path.
	if !strings.Contains(pattern, " ") {
		return ""
	}
	return pattern
}

// cleanPath is the canonical form ServeMux redirects to: path.Clean, with
// a trailing slash kept.
func cleanPath(p string) string {
	if p == "" {
		return "/"
	}
	if p[0] != '/' {
		p = "/" + p
	}
	np := path.Clean(p)
	if p[len(p)-1] == '/' && np != "/" {
		np += "/"
	}
	return np
}

// noRoute runs the mux on a request no pattern matches, to learn whether
// the path exists under another method (405, with Allow) or not at all.
func (s *server) noRoute(w http.ResponseWriter, r *http.Request) {
	rec := &recorder{header: http.Header{}}
	s.mux.ServeHTTP(rec, r)
	switch rec.status {
	case http.StatusMethodNotAllowed:
		if allow := rec.header.Get("Allow"); allow != "" {
			w.Header().Set("Allow", allow)
		}
		writeError(w, http.StatusMethodNotAllowed, "", "method %s is not allowed on %s", r.Method, echo(r.URL.Path))
	case http.StatusNotFound, 0:
		writeError(w, http.StatusNotFound, "", "no route %s %s", r.Method, echo(r.URL.Path))
	default:
		// Anything else the mux answers on its own (a redirect) passes on
		// as it wrote it.
		for k, v := range rec.header {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.status)
		_, _ = w.Write(rec.body.Bytes())
	}
}

// health answers e2b's GET /health: 200 "Health check successful" like the
// real API (its spec says 204, the SDKs do not call it).
func (s *server) health(w http.ResponseWriter, r *http.Request) {
	if hc, ok := s.backend.(HealthChecker); ok {
		if err := hc.Healthy(r.Context()); err != nil {
			s.log.WarnContext(r.Context(), "unhealthy", "error", err)
			writeError(w, http.StatusServiceUnavailable, "", "unhealthy")
			return
		}
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write([]byte("Health check successful"))
}

// trackingWriter remembers whether a response was started, so a panic after
// the header went out does not write a second one.
type trackingWriter struct {
	http.ResponseWriter
	wrote bool
}

func (t *trackingWriter) WriteHeader(code int) {
	t.wrote = true
	t.ResponseWriter.WriteHeader(code)
}

func (t *trackingWriter) Write(b []byte) (int, error) {
	t.wrote = true
	return t.ResponseWriter.Write(b)
}

func (t *trackingWriter) Unwrap() http.ResponseWriter { return t.ResponseWriter }

// recorder captures what the mux answers on its own.
type recorder struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
}

func (r *recorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	if r.body.Len() > 4096 {
		return 0, errors.New("recorder full")
	}
	return r.body.Write(b)
}
