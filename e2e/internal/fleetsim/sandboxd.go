package fleetsim

import (
	"context"
	crand "crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/skiff-dev/skiff/shared/routing"
	pb "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
	"github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1/sandboxdv1connect"
	"github.com/skiff-dev/skiff/shared/sandboxid"
	"github.com/skiff-dev/skiff/wire"
)

// Defaults of SandboxdConfig: a host that, after overcommit, has room for
// DefaultMaxSandboxes sandboxes of the base template (500m, 256 MiB).
const (
	DefaultMaxSandboxes      = 4096
	DefaultCapacityCPUMilli  = DefaultMaxSandboxes * 500
	DefaultCapacityMemoryMiB = DefaultMaxSandboxes * 256
	// DefaultEnvdVersion is envd's version (envd.Version) when this was
	// written; sandboxes of the node's version leave it out of their
	// inventory entries, as real ones do.
	DefaultEnvdVersion = "0.6.4"
	// BaseTemplate is the template every simulated host holds.
	BaseTemplate = "base"
)

// HostKey is the metadata key every seeded or churned sandbox carries with
// its host's node name, so that a reader's list can be asked for one
// host's sandboxes (e2b's metadata filter).
const HostKey = "sim-host"

// SandboxdConfig describes one simulated sandboxd.
type SandboxdConfig struct {
	// NodeName is the host's node (and NodeInventory) name; its tag ends
	// the IDs of its sandboxes.
	NodeName string
	// Token is the node token it accepts: as "Authorization: Bearer" on an
	// RPC, or wire.NodeTokenHeader (the only one on a relayed request).
	Token string
	// Capacity and MaxSandboxes are what Info reports (after overcommit);
	// zero means the defaults.
	CapacityCPUMilli, CapacityMemoryMiB int64
	MaxSandboxes                        int32
	// EnvdVersion is what its sandboxes' envd reports; "" is
	// DefaultEnvdVersion.
	EnvdVersion string
}

func (c *SandboxdConfig) defaults() {
	if c.CapacityCPUMilli == 0 {
		c.CapacityCPUMilli = DefaultCapacityCPUMilli
	}
	if c.CapacityMemoryMiB == 0 {
		c.CapacityMemoryMiB = DefaultCapacityMemoryMiB
	}
	if c.MaxSandboxes == 0 {
		c.MaxSandboxes = DefaultMaxSandboxes
	}
	if c.EnvdVersion == "" {
		c.EnvdVersion = DefaultEnvdVersion
	}
}

// Sandboxd is one simulated sandboxd: its sandboxes in memory, the
// Connect API its clients call, and the relay's answer to envd's /health.
// A Sandbox it hands out, on the Watch stream or in an answer, is never
// changed afterwards (a change replaces it), so streams may marshal it
// while the host changes. It is safe for concurrent use.
type Sandboxd struct {
	// Every RPC this does not define answers connect.CodeUnimplemented.
	sandboxdv1connect.UnimplementedSandboxdServiceHandler

	cfg   SandboxdConfig
	tag   sandboxid.Tag
	token [sha256.Size]byte

	mu        sync.Mutex
	sandboxes map[string]*record
	ids       []string // the keys of sandboxes, for picking one at random
	cpu, mem  int64    // allocated
	started   int      // sandboxes ever started, for their addresses
	watchers  map[*watcher]struct{}
}

// record is a sandbox and its secrets.
type record struct {
	sb      *pb.Sandbox
	envd    string // its envd access token
	traffic string // its traffic token; "" when its ports are public
	index   int    // in Sandboxd.ids
}

// NewSandboxd returns a sandboxd with no sandboxes.
func NewSandboxd(cfg SandboxdConfig) *Sandboxd {
	cfg.defaults()
	return &Sandboxd{
		cfg: cfg, tag: sandboxid.NodeTag(cfg.NodeName), token: sha256.Sum256([]byte(cfg.Token)),
		sandboxes: map[string]*record{}, watchers: map[*watcher]struct{}{},
	}
}

// Spec is what a new sandbox is made of.
type Spec struct {
	Team      string
	Template  string // "" is BaseTemplate
	Metadata  map[string]string
	Resources *pb.Resources // nil: the base template's (500m, 256 MiB)
	// StartedAt is when it started (zero: now); EndAt its deadline.
	StartedAt, EndAt time.Time
	// AllowInternetAccess, AllowPublicTraffic (nil: true), AutoPause,
	// AutoResume, Egress and MaskRequestHost are kept as given, as
	// sandboxd does; a private sandbox gets a traffic token.
	AllowInternetAccess bool
	AllowPublicTraffic  *bool
	AutoPause           bool
	AutoResume          bool
	Egress              *pb.Egress
	MaskRequestHost     string
}

// errFull is a host at its capacity.
var errFull = errors.New("the host is full")

// Start starts a sandbox of spec at once (it runs nothing): the host's
// Watch streams see it, as they see a create.
func (s *Sandboxd) Start(spec Spec) (*pb.CreateResponse, error) {
	if spec.Template == "" {
		spec.Template = BaseTemplate
	}
	if spec.Resources == nil {
		spec.Resources = &pb.Resources{CpuMilli: 500, MemoryMib: 256}
	}
	if spec.StartedAt.IsZero() {
		spec.StartedAt = time.Now()
	}
	public := spec.AllowPublicTraffic == nil || *spec.AllowPublicTraffic
	s.mu.Lock()
	defer s.mu.Unlock()
	res := spec.Resources
	if int32(len(s.sandboxes)) >= s.cfg.MaxSandboxes || s.cpu+res.GetCpuMilli() > s.cfg.CapacityCPUMilli ||
		s.mem+res.GetMemoryMib() > s.cfg.CapacityMemoryMiB {
		return nil, errFull
	}
	var id string
	for {
		var err error
		if id, err = sandboxid.New(s.tag); err != nil {
			return nil, fmt.Errorf("new sandbox ID: %w", err)
		}
		if _, taken := s.sandboxes[id]; !taken {
			break
		}
	}
	sb := &pb.Sandbox{
		Id: id, Template: spec.Template, TemplateVersion: "1", State: pb.SandboxState_SANDBOX_STATE_RUNNING,
		Team: spec.Team, Metadata: spec.Metadata, StartedAt: timestamppb.New(spec.StartedAt), EndAt: timestamppb.New(spec.EndAt),
		Resources: res, EnvdVersion: s.cfg.EnvdVersion, AutoPause: spec.AutoPause, AllowInternetAccess: spec.AllowInternetAccess,
		AutoResume: spec.AutoResume, AllowPublicTraffic: public, Egress: spec.Egress, MaskRequestHost: spec.MaskRequestHost,
		Address: fmt.Sprintf("10.%d.%d.%d", 100+s.started>>16&0x7f, s.started>>8&0xff, s.started&0xff),
	}
	s.started++
	rec := &record{sb: sb, envd: sandboxid.NewAccessToken(id), index: len(s.ids)}
	if !public {
		rec.traffic = randomHex(32)
	}
	s.sandboxes[id] = rec
	s.ids = append(s.ids, id)
	s.cpu += res.GetCpuMilli()
	s.mem += res.GetMemoryMib()
	s.emitLocked(upserted(sb))
	return &pb.CreateResponse{Sandbox: sb, EnvdAccessToken: rec.envd, TrafficAccessToken: rec.traffic}, nil
}

// Remove kills sandbox id; false when there is none.
func (s *Sandboxd) Remove(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.removeLocked(id)
}

func (s *Sandboxd) removeLocked(id string) bool {
	rec, ok := s.sandboxes[id]
	if !ok {
		return false
	}
	last := len(s.ids) - 1
	moved := s.ids[last]
	s.ids[rec.index] = moved
	s.sandboxes[moved].index = rec.index
	s.ids = s.ids[:last]
	delete(s.sandboxes, id)
	s.cpu -= rec.sb.GetResources().GetCpuMilli()
	s.mem -= rec.sb.GetResources().GetMemoryMib()
	s.emitLocked(&pb.WatchResponse{Event: &pb.WatchResponse_Change_{Change: &pb.WatchResponse_Change{
		Type: pb.WatchResponse_CHANGE_TYPE_DELETED, Sandbox: rec.sb}}})
	return true
}

// RemoveRandom kills one sandbox picked at random; "" when there is none.
func (s *Sandboxd) RemoveRandom() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.ids) == 0 {
		return ""
	}
	id := s.ids[rand.IntN(len(s.ids))]
	s.removeLocked(id)
	return id
}

// Random returns one of its sandboxes, picked at random; nil when it
// runs none.
func (s *Sandboxd) Random() *pb.Sandbox {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.ids) == 0 {
		return nil
	}
	return s.sandboxes[s.ids[rand.IntN(len(s.ids))]].sb
}

// Has reports whether it runs sandbox id.
func (s *Sandboxd) Has(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.sandboxes[id]
	return ok
}

// Len is how many sandboxes it runs.
func (s *Sandboxd) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.ids)
}

// Sandboxes returns its sandboxes, in no order (they must not be changed).
func (s *Sandboxd) Sandboxes() []*pb.Sandbox {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*pb.Sandbox, 0, len(s.ids))
	for _, id := range s.ids {
		out = append(out, s.sandboxes[id].sb)
	}
	return out
}

// NodeName is its node's name.
func (s *Sandboxd) NodeName() string { return s.cfg.NodeName }

func upserted(sb *pb.Sandbox) *pb.WatchResponse {
	return &pb.WatchResponse{Event: &pb.WatchResponse_Change_{Change: &pb.WatchResponse_Change{
		Type: pb.WatchResponse_CHANGE_TYPE_UPSERTED, Sandbox: sb}}}
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = crand.Read(b) // crypto/rand.Read never fails
	return hex.EncodeToString(b)
}

// Info describes the host: capacity, allocation, the base template.
func (s *Sandboxd) Info(context.Context, *connect.Request[pb.InfoRequest]) (*connect.Response[pb.InfoResponse], error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return connect.NewResponse(&pb.InfoResponse{
		NodeName: s.cfg.NodeName, Tag: string(s.tag),
		Capacity:     &pb.Resources{CpuMilli: s.cfg.CapacityCPUMilli, MemoryMib: s.cfg.CapacityMemoryMiB},
		MaxSandboxes: s.cfg.MaxSandboxes,
		Allocated:    &pb.Resources{CpuMilli: s.cpu, MemoryMib: s.mem},
		Sandboxes:    int32(len(s.ids)),
		Templates:    []*pb.TemplateVersion{{Name: BaseTemplate, Version: "1"}},
		Runtime:      "simulated",
		EnvdVersion:  s.cfg.EnvdVersion,
	}), nil
}

// Create starts a sandbox of the base template for the request's team.
func (s *Sandboxd) Create(_ context.Context, req *connect.Request[pb.CreateRequest]) (*connect.Response[pb.CreateResponse], error) {
	m := req.Msg
	switch {
	case m.GetSnapshot() != "":
		return nil, connect.NewError(connect.CodeUnimplemented, errors.New("snapshot: the simulated host has no snapshots"))
	case len(m.GetVolumeMounts()) > 0:
		return nil, connect.NewError(connect.CodeUnimplemented, errors.New("volume_mounts: the simulated host has no volumes"))
	case m.GetTemplate() != BaseTemplate:
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("template %q: the simulated host holds %s only", m.GetTemplate(), BaseTemplate))
	case m.GetTeam() == "":
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("team: required"))
	case m.GetTimeout().AsDuration() <= 0:
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("timeout: required, greater than 0"))
	}
	res := proto.CloneOf(m.GetResources())
	if res == nil || res.GetCpuMilli() == 0 || res.GetMemoryMib() == 0 {
		res = &pb.Resources{CpuMilli: 500, MemoryMib: 256, DiskMib: res.GetDiskMib()}
	}
	now := time.Now()
	resp, err := s.Start(Spec{
		Team: m.GetTeam(), Metadata: m.GetMetadata(), Resources: res, StartedAt: now, EndAt: now.Add(m.GetTimeout().AsDuration()),
		AllowInternetAccess: m.AllowInternetAccess == nil || m.GetAllowInternetAccess(), AllowPublicTraffic: m.AllowPublicTraffic,
		AutoPause: m.GetAutoPause(), AutoResume: m.GetAutoResume(), Egress: m.GetEgress(), MaskRequestHost: m.GetMaskRequestHost(),
	})
	if errors.Is(err, errFull) {
		return nil, connect.NewError(connect.CodeResourceExhausted, err)
	}
	if err != nil {
		return nil, connect.NewError(connect.CodeInternal, err)
	}
	return connect.NewResponse(resp), nil
}

// Get returns a sandbox with its tokens.
func (s *Sandboxd) Get(_ context.Context, req *connect.Request[pb.GetRequest]) (*connect.Response[pb.GetResponse], error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rec, ok := s.sandboxes[req.Msg.GetSandboxId()]
	if !ok {
		return nil, notFound(req.Msg.GetSandboxId())
	}
	return connect.NewResponse(&pb.GetResponse{Sandbox: rec.sb, EnvdAccessToken: rec.envd, TrafficAccessToken: rec.traffic}), nil
}

// List returns the sandboxes of a team (every one without), in states.
func (s *Sandboxd) List(_ context.Context, req *connect.Request[pb.ListRequest]) (*connect.Response[pb.ListResponse], error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := &pb.ListResponse{}
	for _, id := range s.ids {
		sb := s.sandboxes[id].sb
		if t := req.Msg.GetTeam(); t != "" && sb.GetTeam() != t {
			continue
		}
		if st := req.Msg.GetStates(); len(st) > 0 && !contains(st, sb.GetState()) {
			continue
		}
		out.Sandboxes = append(out.Sandboxes, sb)
	}
	return connect.NewResponse(out), nil
}

func contains(states []pb.SandboxState, s pb.SandboxState) bool {
	for _, x := range states {
		if x == s {
			return true
		}
	}
	return false
}

// Kill removes a sandbox.
func (s *Sandboxd) Kill(_ context.Context, req *connect.Request[pb.KillRequest]) (*connect.Response[pb.KillResponse], error) {
	if !s.Remove(req.Msg.GetSandboxId()) {
		return nil, notFound(req.Msg.GetSandboxId())
	}
	return connect.NewResponse(&pb.KillResponse{}), nil
}

// SetTimeout moves a sandbox's deadline to now + timeout.
func (s *Sandboxd) SetTimeout(_ context.Context, req *connect.Request[pb.SetTimeoutRequest]) (*connect.Response[pb.SetTimeoutResponse], error) {
	if req.Msg.GetTimeout().AsDuration() <= 0 {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("timeout: required, greater than 0"))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	rec, ok := s.sandboxes[req.Msg.GetSandboxId()]
	if !ok {
		return nil, notFound(req.Msg.GetSandboxId())
	}
	sb := proto.CloneOf(rec.sb)
	sb.EndAt = timestamppb.New(time.Now().Add(req.Msg.GetTimeout().AsDuration()))
	rec.sb = sb
	s.emitLocked(upserted(sb))
	return connect.NewResponse(&pb.SetTimeoutResponse{Sandbox: sb}), nil
}

func notFound(id string) error {
	return connect.NewError(connect.CodeNotFound, fmt.Errorf("sandbox %q not found", id))
}

// Handler serves the API as sandboxd's listener does: a request that names
// a sandbox (E2b-Sandbox-Id / E2b-Sandbox-Port, or a <port>-<id>. host)
// goes to the relay, anything else to the Connect service, both behind the
// node token.
func (s *Sandboxd) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle(sandboxdv1connect.NewSandboxdServiceHandler(s))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, err := routing.Parse(r)
		relayed := !errors.Is(err, routing.ErrNoTarget)
		if !s.authorized(r, relayed) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="sandboxd"`)
			if ew := connect.NewErrorWriter(); !relayed && ew.IsSupported(r) {
				_ = ew.Write(w, r, connect.NewError(connect.CodeUnauthenticated, errors.New("missing or wrong node token")))
				return
			}
			wire.WriteError(w, http.StatusUnauthorized, "missing or wrong node token")
			return
		}
		if relayed {
			s.relay(w, r)
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// authorized checks the node token: wire.NodeTokenHeader, or on an RPC
// "Authorization: Bearer" too.
func (s *Sandboxd) authorized(r *http.Request, relayed bool) bool {
	if s.tokenMatches(r.Header.Get(wire.NodeTokenHeader)) {
		return true
	}
	bearer, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return !relayed && ok && s.tokenMatches(strings.TrimSpace(bearer))
}

func (s *Sandboxd) tokenMatches(got string) bool {
	if got == "" {
		return false
	}
	sum := sha256.Sum256([]byte(got))
	return subtle.ConstantTimeCompare(sum[:], s.token[:]) == 1
}

// relay answers what sandboxd's relay would forward into the sandbox:
// envd's GET /health (204) for a sandbox it runs; 502 in e2b's shape for
// one it does not run, as the relay does; 501 for anything else, which
// the simulation does not carry.
func (s *Sandboxd) relay(w http.ResponseWriter, r *http.Request) {
	t, err := routing.Parse(r)
	if err != nil {
		wire.WriteError(w, http.StatusBadRequest, err.Error())
		return
	}
	s.mu.Lock()
	_, ok := s.sandboxes[t.SandboxID]
	s.mu.Unlock()
	switch {
	case !ok:
		routing.WriteSandboxNotFound(w, r, t.SandboxID)
	case t.IsEnvd() && r.Method == http.MethodGet && r.URL.Path == "/health":
		w.WriteHeader(http.StatusNoContent)
	default:
		wire.WriteError(w, http.StatusNotImplemented, "the simulated host answers envd's GET /health only")
	}
}
