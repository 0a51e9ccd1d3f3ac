// Package server assembles envd's HTTP surface: the Connect services, the
// plain routes (/health, /init, /envs, /metrics, /files), CORS and the access
// token check, behind one http.Handler.
package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"

	"github.com/skiff-dev/skiff/envd"
	"github.com/skiff-dev/skiff/envd/internal/files"
	"github.com/skiff-dev/skiff/envd/internal/filesystem"
	"github.com/skiff-dev/skiff/envd/internal/logs"
	"github.com/skiff-dev/skiff/envd/internal/process"
	"github.com/skiff-dev/skiff/envd/internal/reap"
	"github.com/skiff-dev/skiff/envd/internal/state"
	"github.com/skiff-dev/skiff/envd/proto/filesystem/filesystemconnect"
	"github.com/skiff-dev/skiff/envd/proto/process/processconnect"
	"github.com/skiff-dev/skiff/wire"
)

// DefaultPort is where the e2b SDKs expect envd.
const DefaultPort = 49983

// Options configures envd.
type Options struct {
	ListenAddress string
	Port          int
	// ListenFD, when above 2, is an inherited socket that already listens
	// (made by whoever starts envd, in the sandbox's network): envd serves
	// on it instead of listening on ListenAddress and Port. Connections
	// made before envd runs wait in its backlog, so the host needs no
	// polling to learn when envd is up.
	ListenFD int
	// WorkloadCgroupFD, when above 2, is an inherited cgroup.procs of the
	// cgroup that every process envd starts is moved into before it runs
	// (made by sandboxd's native runtime, with a pids limit that leaves
	// some of the sandbox's for envd).
	WorkloadCgroupFD int
	// MaxInitBytes bounds the body of POST /init.
	MaxInitBytes int64

	// Init makes envd the sandbox's init: it reaps orphaned processes.
	// Its flag defaults to whether envd is PID 1.
	Init bool
	// LogProcessOutput logs the output lines of processes; its flag
	// defaults to Init (see ResolveDefaults).
	LogProcessOutput bool
	// LogOutputLimit and LogLimit bound, in bytes over envd's lifetime,
	// the output lines and all lines of the log.
	LogOutputLimit ByteSize
	LogLimit       ByteSize

	// Version prints envd's version and exits.
	Version bool

	// flags is the set AddFlags registered into, for Complete.
	flags *pflag.FlagSet

	// Log is where envd logs (not a flag); nil logs nothing.
	Log *logs.Log
	// Reaper is the orphan reaper when envd is init (not a flag); nil
	// otherwise.
	Reaper *reap.Reaper
}

// NewOptions returns the defaults.
func NewOptions() Options {
	return Options{
		ListenAddress:  "0.0.0.0",
		Port:           DefaultPort,
		MaxInitBytes:   1 << 20,
		Init:           os.Getpid() == 1,
		LogOutputLimit: logs.DefaultOutputLimit,
		LogLimit:       logs.DefaultLimit,
	}
}

// AddFlags registers envd's flags, each defaulting to the field's value.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	o.flags = fs
	fs.BoolVar(&o.Version, "version", o.Version, "Print the envd version envd advertises, the one the SDKs gate features on ("+envd.Version+"), and exit.")
	fs.StringVar(&o.ListenAddress, "listen-address", o.ListenAddress, "Address to listen on; not empty.")
	fs.IntVar(&o.Port, "port", o.Port, "Port to listen on, 0 to 65535 (0: any free one); the e2b SDKs expect 49983.")
	fs.IntVar(&o.ListenFD, "listen-fd", o.ListenFD, "Serve on this inherited socket that already listens, a file descriptor above 2, instead of --listen-address and --port; "+
		"0: listen on those. sandboxd's native runtime makes it in the sandbox's network, so its first request waits for envd instead of polling it. "+
		"Processes envd starts do not inherit it.")
	fs.IntVar(&o.WorkloadCgroupFD, "workload-cgroup-fd", o.WorkloadCgroupFD, "Move every process envd starts, before it runs (just after its start where the host refuses PTRACE_TRACEME), into the cgroup whose cgroup.procs is this inherited file "+
		"descriptor, above 2, open for writing; 0: leave them in envd's cgroup. sandboxd's native runtime makes it with a pids limit that keeps some of the sandbox's for envd. "+
		"Processes envd starts do not inherit it.")
	fs.BoolVar(&o.Init, "init", o.Init, "Act as the sandbox's init: reap orphaned processes. Defaults to true when envd is PID 1; "+
		"when it is not, --init makes it a child subreaper (for tests); --init=false as PID 1 leaves orphans unreaped.")
	fs.BoolVar(&o.LogProcessOutput, "log-process-output", o.LogProcessOutput, "Log each output line of the processes started through the process service "+
		"(source stdout or stderr). Defaults to --init.")
	fs.Var(&o.LogOutputLimit, "log-output-limit", "Most bytes of process output lines logged in envd's lifetime, JSON included (suffixes KiB, MiB, GiB); "+
		"then one line says output logging stopped. Greater than 0.")
	fs.Var(&o.LogLimit, "log-limit", "Most bytes envd logs in its lifetime, all lines together (suffixes KiB, MiB, GiB); then one line says logging stopped, "+
		"and nothing follows. Greater than 0.")
}

// Complete sets the defaults that depend on other flags once the flag set
// AddFlags registered into is parsed: --log-process-output follows --init
// unless given.
func (o *Options) Complete() error {
	if o.flags == nil || !o.flags.Changed("log-process-output") {
		o.LogProcessOutput = o.Init
	}
	return nil
}

// Validate reports every option that cannot work, naming its flag.
func (o *Options) Validate() error {
	var errs []error
	if o.Port < 0 || o.Port > 65535 {
		errs = append(errs, fmt.Errorf("--port must be between 0 and 65535, got %d", o.Port))
	}
	if o.ListenFD != 0 && o.ListenFD < 3 {
		errs = append(errs, fmt.Errorf("--listen-fd must be above 2 (0: listen on --listen-address and --port), got %d", o.ListenFD))
	}
	if o.WorkloadCgroupFD != 0 && o.WorkloadCgroupFD < 3 {
		errs = append(errs, fmt.Errorf("--workload-cgroup-fd must be above 2 (0: none), got %d", o.WorkloadCgroupFD))
	}
	if o.WorkloadCgroupFD != 0 && o.WorkloadCgroupFD == o.ListenFD {
		errs = append(errs, fmt.Errorf("--workload-cgroup-fd and --listen-fd must differ, both are %d", o.ListenFD))
	}
	if o.ListenAddress == "" {
		errs = append(errs, errors.New("--listen-address must not be empty"))
	}
	if o.LogOutputLimit <= 0 {
		errs = append(errs, errors.New("--log-output-limit must be positive"))
	}
	if o.LogLimit <= 0 {
		errs = append(errs, errors.New("--log-limit must be positive"))
	}
	return errors.Join(errs...)
}

// Server is envd's HTTP server and the services behind it.
type Server struct {
	logger     *slog.Logger
	sandbox    *state.Sandbox
	process    *process.Service
	filesystem *filesystem.Service
	handler    http.Handler
	opts       Options
}

// New assembles the services and routes.
func New(opts Options) *Server {
	if opts.Log == nil {
		opts.Log = logs.Discard()
	}
	sb := state.New()
	s := &Server{logger: opts.Log.Logger(), sandbox: sb, process: process.New(sb, opts.Log, opts.Reaper), filesystem: filesystem.New(sb), opts: opts}
	mux := http.NewServeMux()
	connectOpts := []connect.HandlerOption{connect.WithCompressMinBytes(1024)}
	mux.Handle(onFirstRequest(processconnect.ProcessName, func() (string, http.Handler) {
		return processconnect.NewProcessHandler(s.process, connectOpts...)
	}))
	mux.Handle(onFirstRequest(filesystemconnect.FilesystemName, func() (string, http.Handler) {
		return filesystemconnect.NewFilesystemHandler(s.filesystem, append(connectOpts, connect.WithInterceptors(filesystem.Legacy()))...)
	}))
	filesHandler := files.New(sb)
	mux.Handle("/files", filesHandler)
	mux.Handle("/files/compose", filesHandler)
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
	mux.HandleFunc("POST /init", s.init)
	mux.HandleFunc("GET /envs", s.envs)
	mux.HandleFunc("GET /metrics", metrics)
	s.handler = cors(requireToken(sb, mux))
	return s
}

// onFirstRequest routes Connect service name's procedures to the handler
// build makes, built on the service's first request: building connect's
// handlers (a configuration, codecs and compressors for every procedure)
// was 7% of the CPU of an envd that starts, runs one command and exits,
// and most sandboxes never call one of the two services.
func onFirstRequest(name string, build func() (string, http.Handler)) (string, http.Handler) {
	prefix := "/" + name + "/"
	handler := sync.OnceValue(func() http.Handler {
		path, h := build()
		if path != prefix {
			panic(fmt.Sprintf("envd: service %s serves %s, not %s", name, path, prefix))
		}
		return h
	})
	return prefix, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { handler().ServeHTTP(w, r) })
}

// Close stops every watcher, kills the processes envd started, and waits for
// them.
func (s *Server) Close() {
	s.filesystem.Close()
	s.process.Close()
}

// Handler is envd's whole HTTP surface.
func (s *Server) Handler() http.Handler { return s.handler }

// Sandbox is the state /init sets.
func (s *Server) Sandbox() *state.Sandbox { return s.sandbox }

// Serve serves on ln until ctx ends, then stops accepting, gives open
// requests a few seconds, and kills the processes it started.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{
		Handler:           s.handler,
		ReadHeaderTimeout: 30 * time.Second,
		IdleTimeout:       640 * time.Second,
		MaxHeaderBytes:    1 << 20,
		BaseContext:       func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
	}
	// HTTP/1.1 for the SDKs, and HTTP/2 without TLS (h2c) for gRPC clients
	// and bidirectional streams; TLS ends at the edge.
	srv.Protocols = new(http.Protocols)
	srv.Protocols.SetHTTP1(true)
	srv.Protocols.SetUnencryptedHTTP2(true)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		s.Close()
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	s.logger.Info("envd shutting down")
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := srv.Shutdown(shutdownCtx)
	if err != nil {
		_ = srv.Close() // streams (a long Start) do not end by themselves
	}
	serveErr := <-errc
	s.Close()
	if errors.Is(serveErr, http.ErrServerClosed) {
		return nil
	}
	return fmt.Errorf("serve: %w", serveErr)
}

// Run listens on the configured address and serves until ctx ends.
func (s *Server) Run(ctx context.Context) error {
	if fd := s.opts.WorkloadCgroupFD; fd > 0 {
		// Closed on exec, so that no process envd starts can move others.
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFD, unix.FD_CLOEXEC); err != nil {
			return fmt.Errorf("--workload-cgroup-fd %d: %w", fd, err)
		}
		s.process.SetWorkloadCgroup(os.NewFile(uintptr(fd), "workload-cgroup-fd"))
	}
	ln, err := s.listen()
	if err != nil {
		return err
	}
	s.logger.InfoContext(ctx, "envd listening", "address", ln.Addr().String())
	return s.Serve(ctx, ln)
}

// init is POST /init, the host's hook: the access token, default user,
// workdir and environment. Once a token is set, changing anything takes that
// token.
func (s *Server) init(w http.ResponseWriter, r *http.Request) {
	if s.sandbox.TokenSet() && !s.sandbox.CheckToken(r.Header.Get(wire.AccessTokenHeader)) {
		s.logger.Warn("init refused: missing or wrong access token")
		wire.WriteError(w, http.StatusUnauthorized, unauthorizedMessage)
		return
	}
	var in wire.EnvdInit
	if r.ContentLength != 0 {
		dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, s.opts.MaxInitBytes))
		if err := dec.Decode(&in); err != nil {
			wire.WriteError(w, http.StatusBadRequest, fmt.Sprintf("invalid init body: %v", err))
			return
		}
	}
	// The host's clock: envd checks it but does not set the clock. A
	// sandbox shares its host's kernel clock, which is already right; e2b
	// sets it because its VMs resume from snapshots with stale clocks.
	if in.Timestamp != "" {
		if _, err := time.Parse(time.RFC3339Nano, in.Timestamp); err != nil {
			wire.WriteError(w, http.StatusBadRequest, fmt.Sprintf("invalid init timestamp: %v", err))
			return
		}
	}
	if in.DefaultUser != "" {
		if _, err := s.sandbox.User(in.DefaultUser); err != nil {
			wire.WriteError(w, http.StatusBadRequest, err.Error())
			return
		}
	}
	s.sandbox.Apply(in)
	s.logInit(in)
	w.Header().Set("X-Envd-Version", envd.Version)
	w.WriteHeader(http.StatusNoContent)
}

// envs is GET /envs: the default environment of every process.
func (s *Server) envs(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(s.sandbox.Env())
}

// logInit logs what an /init changed, never a value of the token or of an
// environment variable.
func (s *Server) logInit(in wire.EnvdInit) {
	token := "unchanged"
	if in.AccessToken != nil {
		token = "set"
		if *in.AccessToken == "" {
			token = "cleared"
		}
	}
	attrs := []any{"access_token", token, "env_vars", len(in.EnvVars)}
	if in.DefaultUser != "" {
		attrs = append(attrs, "default_user", in.DefaultUser)
	}
	if in.DefaultWorkdir != "" {
		attrs = append(attrs, "default_workdir", logs.Truncate(in.DefaultWorkdir, 1<<10))
	}
	if in.Timestamp != "" {
		attrs = append(attrs, "timestamp", in.Timestamp)
	}
	s.logger.Info("init", attrs...)
}

// listen returns the inherited socket of --listen-fd, or listens on the
// address and port.
func (s *Server) listen() (net.Listener, error) {
	if fd := s.opts.ListenFD; fd > 0 {
		f := os.NewFile(uintptr(fd), "listen-fd")
		if f == nil {
			return nil, fmt.Errorf("--listen-fd %d: not an open file", fd)
		}
		// FileListener serves on a duplicate that closes on exec; the
		// inherited descriptor is closed, so no process envd starts
		// inherits the socket.
		defer f.Close()
		ln, err := net.FileListener(f)
		if err != nil {
			return nil, fmt.Errorf("--listen-fd %d: %w", fd, err)
		}
		return ln, nil
	}
	addr := net.JoinHostPort(s.opts.ListenAddress, strconv.Itoa(s.opts.Port))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", addr, err)
	}
	return ln, nil
}
