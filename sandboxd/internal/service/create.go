package service

import (
	"bufio"
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/skiff-dev/skiff/sandboxd/internal/ipam"
	"github.com/skiff-dev/skiff/sandboxd/internal/prepared"
	"github.com/skiff-dev/skiff/sandboxd/internal/registry"
	"github.com/skiff-dev/skiff/sandboxd/internal/sandboxrt"
	"github.com/skiff-dev/skiff/sandboxd/internal/snapshot"
	"github.com/skiff-dev/skiff/sandboxd/internal/store"
	"github.com/skiff-dev/skiff/sandboxd/internal/template"
	"github.com/skiff-dev/skiff/shared/routing"
	pb "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
	"github.com/skiff-dev/skiff/shared/sandboxid"
	"github.com/skiff-dev/skiff/shared/tracing"
	"github.com/skiff-dev/skiff/wire"
)

const (
	// sandboxHostname is every sandbox's host name, as in e2b's sandboxes.
	sandboxHostname = "e2b"
	// defaultUser and defaultWorkdir are what e2b's templates set through
	// envd's /init, when the template has that user.
	defaultUser    = "user"
	defaultWorkdir = "/home/user"
	// cleanupTimeout bounds the undoing of a failed create, which runs even
	// when the caller has gone.
	cleanupTimeout = time.Minute
)

// Create starts a sandbox for a team and returns once its envd answers and
// holds a fresh access token.
func (s *Service) Create(ctx context.Context, req *connect.Request[pb.CreateRequest]) (*connect.Response[pb.CreateResponse], error) {
	m := req.Msg
	var f fieldErrors
	var tmpl *template.Template
	var snap *snapshot.Record
	var err error
	res := m.GetResources()
	if m.GetSnapshot() != "" {
		// Its layers are held until the sandbox's record names them, or
		// its start is undone.
		var release func()
		if snap, release, err = s.holdSnapshot(m.GetTeam(), m.GetSnapshot()); err != nil {
			return nil, s.countCreate(kindCreate, err)
		}
		defer release()
		tmpl, res = snapshotTemplate(snap), snapshotResources(snap, res)
	} else if tmpl, err = s.checkTemplate(&f, m.GetTemplate()); err != nil {
		return nil, s.countCreate(kindCreate, toConnect(err))
	}
	l := &launch{kind: kindCreate, tmpl: tmpl, envVars: m.GetEnvVars()}
	l.cpu, l.mem, l.disk = s.resources(&f, res)
	l.timeout = s.checkTimeout(&f, "timeout", m.GetTimeout(), true)
	checkMetadata(&f, m.GetMetadata())
	checkEnvVars(&f, m.GetEnvVars())
	checkTeam(&f, m.GetTeam())
	checkEgress(&f, m.GetEgress(), m.GetMaskRequestHost())
	checkVolumeMounts(&f, m.GetVolumeMounts())
	if err := f.err(); err != nil {
		return nil, s.countCreate(kindCreate, err)
	}
	if err := s.checkDisk("create", s.stateDir); err != nil {
		return nil, s.countCreate(kindCreate, toConnect(err))
	}
	mounts, err := s.resolveVolumeMounts(m.GetTeam(), m.GetVolumeMounts())
	if err != nil {
		return nil, s.countCreate(kindCreate, err)
	}
	l.rec = store.Record{
		State:               registry.StateRunning,
		Team:                m.GetTeam(),
		Metadata:            maps.Clone(m.GetMetadata()),
		AutoPause:           m.GetAutoPause(),
		AllowInternetAccess: m.AllowInternetAccess == nil || m.GetAllowInternetAccess(),
		AutoResume:          m.GetAutoResume(),
		AutoPauseFilesOnly:  m.GetAutoPauseFilesOnly(),
		EnvVars:             maps.Clone(m.GetEnvVars()),
		TrafficAccessToken:  trafficToken(m.AllowPublicTraffic),
		MaskRequestHost:     m.GetMaskRequestHost(),
		VolumeMounts:        mounts,
	}
	if e := m.GetEgress(); e != nil {
		l.rec.Egress = &store.Egress{AllowOut: slices.Clone(e.GetAllowOut()), DenyOut: slices.Clone(e.GetDenyOut())}
	}
	if snap != nil {
		s.fromSnapshot(l, snap)
	}
	rec, token, err := s.launch(ctx, l)
	if err != nil {
		return nil, s.countCreate(kindCreate, toConnect(err))
	}
	_ = s.countCreate(kindCreate, nil)
	return connect.NewResponse(&pb.CreateResponse{
		Sandbox: s.toSandbox(rec), EnvdAccessToken: token, TrafficAccessToken: rec.TrafficAccessToken,
	}), nil
}

// Warm starts a sandbox that belongs to no one yet, for a warm pool. Its
// envd holds a token only sandboxd knows until a Claim hands it over.
func (s *Service) Warm(ctx context.Context, req *connect.Request[pb.WarmRequest]) (*connect.Response[pb.WarmResponse], error) {
	m := req.Msg
	var f fieldErrors
	tmpl, err := s.checkTemplate(&f, m.GetTemplate())
	if err != nil {
		return nil, s.countCreate(kindWarm, toConnect(err))
	}
	l := &launch{kind: kindWarm, tmpl: tmpl}
	l.cpu, l.mem, l.disk = s.resources(&f, m.GetResources())
	checkPool(&f, m.GetPool())
	if err := f.err(); err != nil {
		return nil, s.countCreate(kindWarm, err)
	}
	if err := s.checkDisk("warm", s.stateDir); err != nil {
		return nil, s.countCreate(kindWarm, toConnect(err))
	}
	l.rec = store.Record{State: registry.StateWarm, Pool: m.GetPool(), AllowInternetAccess: true}
	rec, _, err := s.launch(ctx, l)
	if err != nil {
		return nil, s.countCreate(kindWarm, toConnect(err))
	}
	_ = s.countCreate(kindWarm, nil)
	return connect.NewResponse(&pb.WarmResponse{Sandbox: s.toSandbox(rec)}), nil
}

// launch is one sandbox to start.
type launch struct {
	kind           string
	tmpl           *template.Template
	cpu, mem, disk int64
	envVars        map[string]string
	timeout        time.Duration // 0 for a warm sandbox, which has no deadline
	rec            store.Record  // the caller's part of the record
	// layers are the host paths of rec.Layers, for the runtime.
	layers []string
	// image, when set, is the state image the sandbox is restored from
	// (sandboxrt.Spec.Image), whose envd holds imageToken.
	image, imageToken string
	// volumes are rec.VolumeMounts for the runtime (holdVolumes).
	volumes []sandboxrt.Volume
	undo    []func(context.Context)
}

// tracer makes sandboxd's own spans: a launch and its steps.
var tracer = tracing.Tracer("sandboxd")

// launch starts l: capacity, ID, address, network, runtime, envd ready,
// envd's token, record, deadline. A failed step undoes the earlier ones in
// reverse order, so nothing of the sandbox is left. It is the span
// "sandbox.launch", with one span for each step that takes time
// ("sandbox.network_setup", "sandbox.runtime_start", "envd.wait_ready",
// "envd.init").
func (s *Service) launch(ctx context.Context, l *launch) (_ *store.Record, token string, err error) {
	began := time.Now()
	ctx, span := tracer.Start(ctx, "sandbox.launch", trace.WithAttributes(
		tracing.TemplateKey.String(l.tmpl.Name), attribute.String("skiff.kind", l.kind), tracing.NodeKey.String(s.cfg.NodeName)))
	defer tracing.End(span, &err)
	defer func() {
		if err != nil {
			s.log.WarnContext(ctx, "sandbox start failed; undoing it", "kind", l.kind, "template", l.tmpl.Name, "error", err)
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
			defer cancel()
			for i := len(l.undo) - 1; i >= 0; i-- {
				l.undo[i](cctx)
			}
		}
	}()
	res, err := s.reg.Reserve(l.cpu, l.mem)
	if err != nil {
		return nil, "", fmt.Errorf("reserve capacity: %w", err)
	}
	l.undo = append(l.undo, func(context.Context) { res.Release() })
	// A prepared sandbox (package prepared) comes with its ID, address and
	// network; a new one is prepared in its place, as after a create that
	// found none.
	var ps *prepared.Sandbox
	if s.preparable(l) {
		defer s.prepared.Fill(l.tmpl)
		ps = s.prepared.Take(ctx, l.tmpl)
	}
	if ps == nil {
		id, err := sandboxid.New(s.tag)
		if err != nil {
			return nil, "", fmt.Errorf("new sandbox ID: %w", err)
		}
		ps = &prepared.Sandbox{ID: id}
	}
	id, block := ps.ID, ps.Block
	span.SetAttributes(tracing.SandboxIDKey.String(id), attribute.Bool("skiff.prepared", ps.NetNS != ""))
	log := s.log.With("sandbox", id)
	defer s.locks.lock(id)()

	if ps.NetNS == "" {
		if block, err = s.ipam.Allocate(id); err != nil {
			return nil, "", fmt.Errorf("allocate address: %w", err)
		}
	}
	l.undo = append(l.undo, func(context.Context) { s.ipam.Release(id) })
	l.undo = append(l.undo, func(ctx context.Context) {
		s.forgetEgress(block)
		if err := s.net.Teardown(ctx, id, block); err != nil {
			log.ErrorContext(ctx, "tear down network of failed sandbox", "error", err)
		}
	})
	step := time.Now()
	netns := ps.NetNS
	if netns == "" {
		sctx, span := tracer.Start(ctx, "sandbox.network_setup")
		netns, err = s.setupNetwork(sctx, id, &l.rec, block)
		tracing.Fail(span, err)
		span.End()
		if err != nil {
			return nil, "", fmt.Errorf("set up network: %w", err)
		}
	}
	tookNet, step := time.Since(step), time.Now()

	if len(l.rec.VolumeMounts) > 0 {
		if l.volumes, err = s.holdVolumes(id, l.rec.Team, l.rec.VolumeMounts, true); err != nil {
			return nil, "", fmt.Errorf("mount volumes: %w", err)
		}
		l.undo = append(l.undo, func(ctx context.Context) { s.releaseVolumes(ctx, id, l.rec.VolumeMounts) })
	}
	logPath := s.logPath(id)
	l.undo = append(l.undo, func(ctx context.Context) {
		if err := s.rt.Stop(ctx, id); err != nil {
			log.ErrorContext(ctx, "stop failed sandbox", "error", err)
		}
		_ = os.Remove(logPath)
	})
	if err := s.startRuntime(ctx, ps, l, block, netns, logPath); err != nil {
		return nil, "", err
	}
	tookRuntime, step := time.Since(step), time.Now()

	token, version, err := s.initEnvd(ctx, id, l, block, "")
	if err != nil {
		return nil, "", err
	}
	tookEnvd, step := time.Since(step), time.Now()
	rec := s.newRecord(l, id, block, token, version)
	if err := s.reg.Add(res, &rec); err != nil {
		return nil, "", fmt.Errorf("record sandbox: %w", err)
	}
	tookRecord := time.Since(step)
	if rec.State == registry.StateRunning {
		s.deadlines.Set(id, rec.EndAt)
	}
	s.watchExit(id)
	kind := l.kind
	if ps.NetNS != "" {
		kind = kindCreatePrepared
	}
	s.metrics.createDuration.WithLabelValues(kind).Observe(time.Since(began).Seconds())
	log.InfoContext(ctx, "sandbox started", "kind", l.kind, "template", rec.Template, "state", rec.State,
		"team", rec.Team, "pool", rec.Pool, "cpu_milli", rec.CPUMilli, "memory_mib", rec.MemoryMiB, "duration", time.Since(began),
		"network", tookNet, "runtime", tookRuntime, "envd", tookEnvd, "record", tookRecord, "prepared", ps.NetNS != "")
	return &rec, token, nil
}

// startRuntime starts the sandbox's processes in the runtime: a prepared
// sandbox's, or a new one's in netns. It is the span
// "sandbox.runtime_start".
func (s *Service) startRuntime(ctx context.Context, ps *prepared.Sandbox, l *launch, block ipam.Block, netns, logPath string) (err error) {
	ctx, span := tracer.Start(ctx, "sandbox.runtime_start", trace.WithAttributes(attribute.String("skiff.runtime", s.rt.Name())))
	defer tracing.End(span, &err)
	if ps.NetNS != "" {
		if err := s.preparer.StartPrepared(ctx, ps.ID, sandboxrt.Limits{CPUMilli: l.cpu, MemoryMiB: l.mem, DiskMiB: l.disk}); err != nil {
			return fmt.Errorf("start prepared sandbox: %w", err)
		}
		return nil
	}
	if err := s.rt.Start(ctx, s.spec(ps.ID, l, block, netns, logPath)); err != nil {
		return fmt.Errorf("start sandbox: %w", err)
	}
	return nil
}

// holdSnapshot finds team's snapshot ref and holds its layers and image
// from sweeps until release: a DeleteSnapshot (or a snapshot taking over
// its name) sweeps what no record and no hold names. One deleted between
// the look-up and the hold, its layers swept, is looked up once more (a
// new snapshot may hold the name now), then not found.
func (s *Service) holdSnapshot(team, ref string) (_ *snapshot.Record, release func(), _ error) {
	for try := 0; ; try++ {
		snap, err := s.findSnapshot(team, ref)
		if err != nil {
			return nil, nil, err
		}
		ids := slices.Clone(snap.Layers)
		if snap.Image != "" {
			ids = append(ids, snap.Image)
		}
		release := s.hold(ids...)
		whole := true
		for _, id := range snap.Layers {
			whole = whole && s.snapshots.HasLayer(id)
		}
		if whole {
			return snap, release, nil
		}
		release()
		if try > 0 {
			return nil, nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("snapshot %q not found", ref))
		}
	}
}

// sandboxEnv is the environment envd gives every process of sandbox id:
// the create's own variables, and e2b's E2B_SANDBOX, E2B_SANDBOX_ID and
// E2B_TEMPLATE_ID (which e2b's envd sets from the host's metadata, and
// keeps over a variable of the create's by those names).
func sandboxEnv(id, template string, vars map[string]string) map[string]string {
	env := make(map[string]string, len(vars)+3)
	maps.Copy(env, vars)
	maps.Copy(env, idVars(id, template))
	return env
}

// idVars are e2b's variables naming sandbox id and its template: its
// envd's environment, and the files it writes for processes it did not
// start, /run/e2b/.<name>. The template's is left out when there is none.
func idVars(id, template string) map[string]string {
	out := map[string]string{"E2B_SANDBOX": "true", "E2B_SANDBOX_ID": id}
	if template != "" {
		out["E2B_TEMPLATE_ID"] = template
	}
	return out
}

// initEnvd waits for the new sandbox's envd to answer ("envd.wait_ready")
// and gives it its first token (token, or a new one when empty), the
// environment and (when the template has e2b's user) the default user and
// working directory ("envd.init").
func (s *Service) initEnvd(ctx context.Context, id string, l *launch, block ipam.Block, token string) (_, version string, err error) {
	addr := s.envdAddr(block)
	started := time.Now()
	wctx, span := tracer.Start(ctx, "envd.wait_ready")
	err = s.envd.WaitHealthy(wctx, addr, s.cfg.EnvdReadyTimeout)
	tracing.Fail(span, err)
	span.End()
	if err != nil {
		return "", "", err
	}
	s.metrics.envdReady.Observe(time.Since(started).Seconds())
	if token == "" {
		token = sandboxid.NewAccessToken(id)
	}
	in := &wire.EnvdInit{AccessToken: &token, EnvVars: sandboxEnv(id, l.tmpl.Name, l.envVars), Timestamp: s.clock.Now().UTC().Format(time.RFC3339Nano)}
	if hasUser(l.tmpl.Rootfs, defaultUser) {
		in.DefaultUser, in.DefaultWorkdir = defaultUser, defaultWorkdir
	}
	ictx, span := tracer.Start(ctx, "envd.init")
	// A restored envd holds its source's token until this /init.
	version, err = s.envd.Init(ictx, addr, l.imageToken, in)
	tracing.Fail(span, err)
	span.End()
	if err != nil {
		return "", "", err
	}
	if l.image != "" {
		// A restored sandbox has its source's files, which name the
		// source, its address and, from another host, its resolver.
		for path, content := range s.sandboxFiles(id, l.tmpl.Name, block) {
			if err := s.envd.WriteFile(ctx, addr, token, path, content); err != nil {
				return "", "", err
			}
		}
	}
	return token, version, nil
}

// newRecord is the record of the sandbox l started as id.
func (s *Service) newRecord(l *launch, id string, block ipam.Block, token, version string) store.Record {
	now := s.clock.Now()
	rec := l.rec
	rec.ID, rec.Template, rec.TemplateVersion, rec.RootfsPath = id, l.tmpl.Name, l.tmpl.Version, l.tmpl.Rootfs
	rec.StartedAt, rec.RunStart = now, now
	if l.timeout > 0 {
		rec.EndAt, rec.Timeout = now.Add(l.timeout), l.timeout
	}
	rec.CPUMilli, rec.MemoryMiB, rec.DiskMiB = l.cpu, l.mem, l.disk
	rec.EnvdAccessToken = token
	rec.Runtime = s.rt.Name()
	rec.Address = block.Sandbox.String()
	rec.EnvdVersion = version
	return rec
}

// spec is what the runtime needs to start sandbox id.
func (s *Service) spec(id string, l *launch, block ipam.Block, netns, logPath string) *sandboxrt.Spec {
	return &sandboxrt.Spec{
		ID:        id,
		Rootfs:    l.tmpl.Rootfs,
		Layers:    l.layers,
		CPUMilli:  l.cpu,
		MemoryMiB: l.mem,
		DiskMiB:   l.disk,
		NetNS:     netns,
		Hostname:  sandboxHostname,
		Envd:      s.cfg.Envd,
		EnvdArgs:  []string{"--port", strconv.Itoa(routing.EnvdPort)},
		EnvdPort:  routing.EnvdPort,
		Files:     s.sandboxFiles(id, l.tmpl.Name, block),
		Log:       logPath,
		Image:     l.image,
		Volumes:   l.volumes,
	}
}

// sandboxFiles are the files written into sandbox id's root before it
// starts: its resolver and its own name for its address in block, and
// e2b's /run/e2b/.E2B_SANDBOX, .E2B_SANDBOX_ID and .E2B_TEMPLATE_ID.
func (s *Service) sandboxFiles(id, template string, block ipam.Block) map[string][]byte {
	hosts := "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n" +
		block.Sandbox.String() + "\t" + sandboxHostname + "\n"
	files := map[string][]byte{
		"/etc/resolv.conf": s.net.ResolvConf(),
		"/etc/hosts":       []byte(hosts),
	}
	for name, v := range idVars(id, template) {
		files["/run/e2b/."+name] = []byte(v)
	}
	return files
}

func (s *Service) logPath(id string) string { return filepath.Join(s.logDir, id+".log") }

// trafficToken is the traffic access token of a sandbox whose request said
// allowPublicTraffic: a fresh one (random, like an envd token) when it is
// false, none when it is true or absent (public traffic).
func trafficToken(allowPublicTraffic *bool) string {
	if allowPublicTraffic == nil || *allowPublicTraffic {
		return ""
	}
	return newToken()
}

// hasUser reports whether the root filesystem at rootfs has a user name in
// its /etc/passwd (read inside rootfs: its symlinks cannot reach the host).
func hasUser(rootfs, name string) bool {
	root, err := os.OpenRoot(rootfs)
	if err != nil {
		return false
	}
	defer root.Close()
	f, err := root.Open("etc/passwd")
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if user, _, ok := strings.Cut(sc.Text(), ":"); ok && user == name {
			return true
		}
	}
	return false
}
