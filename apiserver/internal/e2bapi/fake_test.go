package e2bapi

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/skiff-dev/skiff/shared/sandboxid"
	"github.com/skiff-dev/skiff/wire"
)

// Teams and keys of the test server: X-API-Key key-a is team-a, key-b is
// team-b; anything else is unauthenticated.
const (
	keyA  = "key-a"
	keyB  = "key-b"
	teamA = "team-a"
	teamB = "team-b"
	node  = "node-1"
)

var (
	t0      = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	discard = slog.New(slog.DiscardHandler)
)

// fakeBackend is an in-memory Backend holding the sandboxes of two teams.
type fakeBackend struct {
	mu        sync.Mutex
	now       time.Time
	sandboxes map[string]*fakeSandbox
	templates []Template
	metrics   map[string][]Metric
	logs      map[string][]LogEntry
	// logQueries are the queries Logs was called with, in order.
	logQueries []LogQuery
	// err, when set, is returned by every sandbox method.
	err   error
	calls map[string]int

	lastCreate  CreateParams
	lastTimeout time.Duration
	lastExtend  bool
	lastKeep    bool

	// snapshots by ID; lastFork is the count of the last Fork.
	snapshots map[string]*Snapshot
	// volumes by ID, with their teams; mounted holds the IDs a sandbox
	// mounts.
	volumes    map[string]*fakeVolume
	mounted    map[string]bool
	nextVolume int
	lastFork   int
	// lastReboot is the reboot flag of the last Connect.
	lastReboot bool
}

type fakeSandbox struct {
	team string
	sb   Sandbox
}

func newFakeBackend() *fakeBackend {
	return &fakeBackend{
		now:       t0,
		sandboxes: map[string]*fakeSandbox{},
		metrics:   map[string][]Metric{},
		logs:      map[string][]LogEntry{},
		calls:     map[string]int{},
		snapshots: map[string]*Snapshot{},
		volumes:   map[string]*fakeVolume{},
		mounted:   map[string]bool{},
		templates: []Template{
			{ID: "base", Aliases: []string{"base-alias"}, Version: "v1", CPUMilli: 2000, MemoryMB: 512, DiskMB: 1024, EnvdVersion: "0.6.13", CreatedAt: t0.Add(-time.Hour)},
			{ID: "python", Version: "v3", CPUMilli: 500, MemoryMB: 1024, DiskMB: 2048, EnvdVersion: "0.6.13", CreatedAt: t0.Add(-2 * time.Hour), UpdatedAt: t0},
		},
	}
}

func (f *fakeBackend) count(m string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[m]
}

func (f *fakeBackend) hostCalls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for m, c := range f.calls {
		if m != "Template" && m != "Templates" {
			n += c
		}
	}
	return n
}

// add puts a sandbox of team into the fake and returns its ID.
func (f *fakeBackend) add(team string, state State, startedAt time.Time, md map[string]string) string {
	id, err := sandboxid.New(sandboxid.NodeTag(node))
	if err != nil {
		panic(err)
	}
	f.addWithID(id, team, state, startedAt, md)
	return id
}

func (f *fakeBackend) addWithID(id, team string, state State, startedAt time.Time, md map[string]string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sandboxes[id] = &fakeSandbox{team: team, sb: Sandbox{
		ID: id, TemplateID: "base", Node: node, State: state, EnvdVersion: "0.6.13",
		EnvdAccessToken: "tok-" + id, StartedAt: startedAt, EndAt: startedAt.Add(5 * time.Minute),
		CPUMilli: 2000, MemoryMB: 512, DiskMB: 1024, Metadata: md,
	}}
}

func (f *fakeBackend) state(id string) State {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.sandboxes[id].sb.State
}

func (f *fakeBackend) endAt(id string) time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.sandboxes[id].sb.EndAt
}

// lookup returns team's sandbox id; the caller holds f.mu.
func (f *fakeBackend) lookup(method, team, id string) (*fakeSandbox, error) {
	f.calls[method]++
	if f.err != nil {
		return nil, f.err
	}
	s, ok := f.sandboxes[id]
	if !ok || s.team != team {
		return nil, fmt.Errorf("%s sandbox %s: %w", strings.ToLower(method), id, ErrNotFound)
	}
	return s, nil
}

func copySandbox(sb Sandbox) *Sandbox {
	sb.Metadata = maps.Clone(sb.Metadata)
	return &sb
}

func (f *fakeBackend) Create(_ context.Context, team string, p CreateParams) (*Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls["Create"]++
	f.lastCreate = p
	if f.err != nil {
		return nil, f.err
	}
	id, err := sandboxid.New(sandboxid.NodeTag(node))
	if err != nil {
		return nil, err
	}
	sb := Sandbox{
		ID: id, TemplateID: p.TemplateID, Node: node, State: StateRunning, EnvdVersion: "0.6.13",
		StartedAt: f.now, EndAt: f.now.Add(p.Timeout), CPUMilli: 2000, MemoryMB: 512, DiskMB: 1024,
		Metadata: p.Metadata, AutoPause: p.AutoPause, AllowInternetAccess: p.AllowInternetAccess,
		AutoResume: p.AutoResume, AllowPublicTraffic: new(p.AllowPublicTraffic == nil || *p.AllowPublicTraffic),
		AllowOut: p.AllowOut, DenyOut: p.DenyOut, MaskRequestHost: p.MaskRequestHost,
	}
	if p.Secure {
		sb.EnvdAccessToken = "tok-" + id
	}
	if !*sb.AllowPublicTraffic {
		sb.TrafficAccessToken = "traffic-" + id
	}
	f.sandboxes[id] = &fakeSandbox{team: team, sb: sb}
	return copySandbox(sb), nil
}

func (f *fakeBackend) Get(_ context.Context, team, id string) (*Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, err := f.lookup("Get", team, id)
	if err != nil {
		return nil, err
	}
	return copySandbox(s.sb), nil
}

func (f *fakeBackend) List(_ context.Context, team string, states []State) ([]Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls["List"]++
	if f.err != nil {
		return nil, f.err
	}
	var out []Sandbox
	for _, s := range f.sandboxes {
		if s.team == team && slices.Contains(states, s.sb.State) {
			out = append(out, *copySandbox(s.sb))
		}
	}
	return out, nil
}

func (f *fakeBackend) Kill(_ context.Context, team, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, err := f.lookup("Kill", team, id); err != nil {
		return err
	}
	delete(f.sandboxes, id)
	return nil
}

func (f *fakeBackend) SetTimeout(_ context.Context, team, id string, timeout time.Duration, onlyExtend bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, err := f.lookup("SetTimeout", team, id)
	if err != nil {
		return err
	}
	f.lastTimeout, f.lastExtend = timeout, onlyExtend
	if timeout <= 0 && !onlyExtend {
		// Ends now: killed, or paused with auto-pause.
		if s.sb.AutoPause {
			s.sb.State = StatePaused
		} else {
			delete(f.sandboxes, id)
		}
		return nil
	}
	end := f.now.Add(timeout)
	if !onlyExtend || end.After(s.sb.EndAt) {
		s.sb.EndAt = end
	}
	return nil
}

func (f *fakeBackend) Connect(_ context.Context, team, id string, timeout time.Duration, reboot bool) (*Sandbox, bool, error) {
	f.lastReboot = reboot
	f.mu.Lock()
	defer f.mu.Unlock()
	s, err := f.lookup("Connect", team, id)
	if err != nil {
		return nil, false, err
	}
	f.lastTimeout = timeout
	end := f.now.Add(timeout)
	resumed := s.sb.State == StatePaused
	if resumed && timeout <= 0 {
		return nil, false, Invalid("timeout", "must be greater than 0 to resume a paused sandbox")
	}
	if resumed {
		s.sb.State = StateRunning
		s.sb.EndAt = end
	} else if end.After(s.sb.EndAt) {
		s.sb.EndAt = end
	}
	return copySandbox(s.sb), resumed, nil
}

func (f *fakeBackend) Pause(_ context.Context, team, id string, keepMemory bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, err := f.lookup("Pause", team, id)
	if err != nil {
		return err
	}
	f.lastKeep = keepMemory
	if s.sb.State == StatePaused {
		return fmt.Errorf("pause sandbox %s: %w", id, ErrConflict)
	}
	s.sb.State = StatePaused
	return nil
}

func (f *fakeBackend) Metrics(_ context.Context, team, id string) ([]Metric, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, err := f.lookup("Metrics", team, id); err != nil {
		return nil, err
	}
	return slices.Clone(f.metrics[id]), nil
}

func (f *fakeBackend) Logs(_ context.Context, team, id string, q LogQuery) ([]LogEntry, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, err := f.lookup("Logs", team, id); err != nil {
		return nil, err
	}
	f.logQueries = append(f.logQueries, q)
	var window []LogEntry
	for _, e := range f.logs[id] {
		if (q.Start.IsZero() || !e.Timestamp.Before(q.Start)) && (q.End.IsZero() || !e.Timestamp.After(q.End)) &&
			(q.MinLevel == "" || slices.Index(logLevels, levelOf(&e)) >= slices.Index(logLevels, q.MinLevel)) && strings.Contains(e.Line, q.Search) {
			window = append(window, e)
		}
	}
	if q.Forward {
		return window[:min(len(window), q.Limit)], nil
	}
	return window[max(0, len(window)-q.Limit):], nil
}

func (f *fakeBackend) Templates(context.Context, string) ([]Template, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls["Templates"]++
	return slices.Clone(f.templates), nil
}

// Template resolves a template, and else one of the team's snapshots, as
// the fleet's does.
func (f *fakeBackend) Template(_ context.Context, team, name string) (*Template, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls["Template"]++
	for _, t := range f.templates {
		if t.ID == name || slices.Contains(t.Aliases, name) {
			return &t, nil
		}
	}
	if ref, ok := ParseSnapshotRef(team, name); ok {
		for _, sn := range f.snapshots {
			if sn.Team == team && (sn.ID == ref.ID || ref.ID == "" && sn.Name == ref.Name && sn.Tag == ref.Tag) {
				c := *sn
				return &Template{ID: sn.ID, Aliases: sn.Names(), Snapshot: &c}, nil
			}
		}
	}
	return nil, fmt.Errorf("template %s: %w", name, ErrNotFound)
}

func (f *fakeBackend) Snapshot(_ context.Context, team, id, name string) (*Snapshot, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb, err := f.lookup("Snapshot", team, id)
	if err != nil {
		return nil, err
	}
	if sb.sb.State == StatePaused {
		return nil, fmt.Errorf("sandbox %s is paused: %w", id, ErrNotFound)
	}
	sid, err := sandboxid.New(sandboxid.NodeTag(node))
	if err != nil {
		return nil, err
	}
	snap := &Snapshot{ID: sid, Team: team, SourceSandbox: id, Template: sb.sb.TemplateID, CreatedAt: f.now.Add(time.Duration(len(f.snapshots)) * time.Second), Node: node}
	if name != "" {
		snap.Name, snap.Tag, _ = strings.Cut(name, ":")
		if snap.Tag == "" {
			snap.Tag = DefaultSnapshotTag
		}
	}
	f.snapshots[sid] = snap
	c := *snap
	return &c, nil
}

func (f *fakeBackend) Snapshots(_ context.Context, team string, flt SnapshotFilter) ([]Snapshot, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls["Snapshots"]++
	var out []Snapshot
	for _, s := range f.snapshots {
		name, tag, tagged := strings.Cut(flt.Name, ":")
		switch {
		case s.Team != team, flt.SourceSandbox != "" && s.SourceSandbox != flt.SourceSandbox:
		case flt.Name != "" && s.ID != flt.Name && (s.Name != name || tagged && s.Tag != tag):
		default:
			out = append(out, *s)
		}
	}
	return out, nil
}

func (f *fakeBackend) DeleteSnapshot(_ context.Context, team string, ref SnapshotRef) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls["DeleteSnapshot"]++
	for id, s := range f.snapshots {
		if s.Team == team && (s.ID == ref.ID || ref.ID == "" && s.Name == ref.Name && s.Tag == ref.Tag) {
			delete(f.snapshots, id)
			return nil
		}
	}
	return fmt.Errorf("snapshot %s: %w", ref, ErrNotFound)
}

func (f *fakeBackend) Fork(_ context.Context, team, id string, count int, timeout time.Duration) ([]ForkResult, error) {
	f.mu.Lock()
	sb, err := f.lookup("Fork", team, id)
	f.lastFork = count
	f.mu.Unlock()
	if err != nil {
		return nil, err
	}
	out := make([]ForkResult, count)
	for i := range out {
		if i == 1 {
			out[i].Err = fmt.Errorf("the host is full: %w", ErrCapacity)
			continue
		}
		if out[i].Sandbox, err = f.Create(context.Background(), team, CreateParams{TemplateID: sb.sb.TemplateID, Timeout: timeout, Secure: true}); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// UpdateNetwork replaces a running sandbox's rules; a paused one is not
// found.
func (f *fakeBackend) UpdateNetwork(_ context.Context, team, id string, u NetworkUpdate) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, err := f.lookup("UpdateNetwork", team, id)
	if err != nil {
		return err
	}
	if s.sb.State != StateRunning {
		return fmt.Errorf("update network of sandbox %s: %w", id, ErrNotFound)
	}
	s.sb.AllowOut, s.sb.DenyOut = u.AllowOut, u.DenyOut
	if u.AllowInternetAccess != nil {
		s.sb.AllowInternetAccess = new(*u.AllowInternetAccess)
	}
	return nil
}

// testTeam authenticates the test server's two keys.
func testTeam(r *http.Request) (string, bool) {
	switch r.Header.Get("X-API-Key") {
	case keyA:
		return teamA, true
	case keyB:
		return teamB, true
	}
	return "", false
}

func newTestServer(t testing.TB) (*fakeBackend, http.Handler) {
	t.Helper()
	f := newFakeBackend()
	h := New(Config{
		Backend: f,
		Team:    testTeam,
		Logger:  discard,
		// Any key: the tests make tokens with it (testVolumeKey).
		VolumeKey: testVolumeKey,
	})
	return f, h
}

var testVolumeKey = []byte("0123456789abcdef0123456789abcdef")

// do sends one request as key (none when empty).
func do(t testing.TB, h http.Handler, method, target, body, key string) *httptest.ResponseRecorder {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req := httptest.NewRequest(method, target, rd)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if key != "" {
		req.Header.Set("X-API-Key", key)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// wantStatus fails unless rec answered status.
func wantStatus(t testing.TB, rec *httptest.ResponseRecorder, status int) {
	t.Helper()
	if rec.Code != status {
		t.Fatalf("status = %d, want %d; body %s", rec.Code, status, rec.Body.String())
	}
}

// wantError checks e2b's error shape: JSON content type, code == status,
// a message containing every one of contains.
func wantError(t testing.TB, rec *httptest.ResponseRecorder, status int, contains ...string) wire.Error {
	t.Helper()
	wantStatus(t, rec, status)
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Fatalf("Content-Type = %q, want application/json", ct)
	}
	m := keysOf(t, rec.Body.Bytes())
	checkKeys(t, "Error", m, []string{"code", "message"}, []string{"error_code"})
	var e wire.Error
	strictDecode(t, rec.Body.Bytes(), &e)
	if e.Code != status {
		t.Fatalf("code = %d, want %d", e.Code, status)
	}
	for _, c := range contains {
		if !strings.Contains(e.Message, c) {
			t.Fatalf("message %q does not contain %q", e.Message, c)
		}
	}
	return e
}

// strictDecode decodes b into v refusing unknown fields.
func strictDecode(t testing.TB, b []byte, v any) {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		t.Fatalf("decode %T: %v in %s", v, err, b)
	}
}

func keysOf(t testing.TB, b []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("decode object: %v in %s", err, b)
	}
	return m
}

// checkKeys checks an object's keys, case-sensitively (DisallowUnknownFields
// matches case-insensitively): every required key present, nothing outside
// required and optional.
func checkKeys(t testing.TB, schema string, m map[string]any, required, optional []string) {
	t.Helper()
	for _, k := range required {
		if _, ok := m[k]; !ok {
			t.Fatalf("%s: required key %q missing in %v", schema, k, m)
		}
	}
	for k := range m {
		if !slices.Contains(required, k) && !slices.Contains(optional, k) {
			t.Fatalf("%s: unexpected key %q", schema, k)
		}
	}
}

// The schemas of docs/e2b-protocol.md §1.3 / §1.6: required and optional
// keys.
var (
	sandboxRequired   = []string{"templateID", "sandboxID", "clientID", "envdVersion"}
	sandboxOptional   = []string{"alias", "envdAccessToken", "trafficAccessToken", "domain"}
	detailRequired    = []string{"templateID", "sandboxID", "clientID", "startedAt", "endAt", "cpuCount", "memoryMB", "diskSizeMB", "state", "envdVersion"}
	detailOptional    = []string{"alias", "envdAccessToken", "allowInternetAccess", "domain", "metadata", "network", "lifecycle", "volumeMounts"}
	listedOptional    = []string{"alias", "metadata", "volumeMounts"}
	metricRequired    = []string{"timestamp", "timestampUnix", "cpuCount", "cpuUsedPct", "memUsed", "memTotal", "memCache", "diskUsed", "diskTotal"}
	templateRequired  = []string{"templateID", "buildID", "cpuCount", "memoryMB", "diskSizeMB", "public", "createdAt", "updatedAt", "createdBy", "lastSpawnedAt", "spawnCount", "buildCount", "envdVersion", "aliases", "names", "buildStatus"}
	withBuildsReq     = []string{"templateID", "public", "aliases", "names", "createdAt", "updatedAt", "lastSpawnedAt", "spawnCount", "builds"}
	buildRequired     = []string{"buildID", "status", "createdAt", "updatedAt", "cpuCount", "memoryMB"}
	buildOptional     = []string{"finishedAt", "diskSizeMB", "envdVersion"}
	logEntryRequired  = []string{"timestamp", "level", "message", "fields"}
	aliasRespRequired = []string{"templateID", "public"}
)

// wireSandbox is e2b's Sandbox as a client reads it.
type wireSandbox struct {
	TemplateID         string  `json:"templateID"`
	SandboxID          string  `json:"sandboxID"`
	Alias              string  `json:"alias"`
	ClientID           string  `json:"clientID"`
	EnvdVersion        string  `json:"envdVersion"`
	EnvdAccessToken    string  `json:"envdAccessToken"`
	TrafficAccessToken *string `json:"trafficAccessToken"`
	Domain             *string `json:"domain"`
}

// wireListed is e2b's ListedSandbox as a client reads it.
type wireListed struct {
	TemplateID   string            `json:"templateID"`
	Alias        string            `json:"alias"`
	SandboxID    string            `json:"sandboxID"`
	ClientID     string            `json:"clientID"`
	StartedAt    time.Time         `json:"startedAt"`
	EndAt        time.Time         `json:"endAt"`
	CPUCount     int32             `json:"cpuCount"`
	MemoryMB     int32             `json:"memoryMB"`
	DiskSizeMB   int32             `json:"diskSizeMB"`
	Metadata     map[string]string `json:"metadata"`
	State        string            `json:"state"`
	EnvdVersion  string            `json:"envdVersion"`
	VolumeMounts []json.RawMessage `json:"volumeMounts"`
}

// wantSandbox checks a create/connect/resume answer and decodes it.
func wantSandbox(t testing.TB, rec *httptest.ResponseRecorder, status int) wireSandbox {
	t.Helper()
	wantStatus(t, rec, status)
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Fatalf("Content-Type = %q", ct)
	}
	checkKeys(t, "Sandbox", keysOf(t, rec.Body.Bytes()), sandboxRequired, sandboxOptional)
	var sb wireSandbox
	strictDecode(t, rec.Body.Bytes(), &sb)
	return sb
}

// decodeList checks a list answer and decodes it.
func decodeList(t testing.TB, rec *httptest.ResponseRecorder) []wireListed {
	t.Helper()
	wantStatus(t, rec, http.StatusOK)
	var raw []map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &raw); err != nil {
		t.Fatalf("decode list: %v in %s", err, rec.Body.String())
	}
	for _, m := range raw {
		checkKeys(t, "ListedSandbox", m, detailRequired, listedOptional)
	}
	var out []wireListed
	strictDecode(t, rec.Body.Bytes(), &out)
	return out
}

type fakeVolume struct {
	team string
	v    Volume
}

func (f *fakeBackend) CreateVolume(_ context.Context, team, name string) (*Volume, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls["CreateVolume"]++
	if f.err != nil {
		return nil, f.err
	}
	for _, fv := range f.volumes {
		if fv.team == team && fv.v.Name == name {
			return nil, fmt.Errorf("create volume %s: %w", name, ErrVolumeExists)
		}
	}
	f.nextVolume++
	id := fmt.Sprintf("00000000-0000-4000-8000-%012d", f.nextVolume)
	f.volumes[id] = &fakeVolume{team: team, v: Volume{ID: id, Name: name, SizeBytes: 10 << 30, UsedBytes: -1}}
	v := f.volumes[id].v
	return &v, nil
}

func (f *fakeBackend) Volumes(_ context.Context, team string) ([]Volume, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls["Volumes"]++
	var out []Volume
	for _, fv := range f.volumes {
		if fv.team == team {
			out = append(out, fv.v)
		}
	}
	return out, nil
}

func (f *fakeBackend) Volume(_ context.Context, team, id string) (*Volume, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls["Volume"]++
	fv, ok := f.volumes[id]
	if !ok || fv.team != team {
		return nil, fmt.Errorf("volume %s: %w", id, ErrNotFound)
	}
	v := fv.v
	v.UsedBytes = 4096
	return &v, nil
}

func (f *fakeBackend) DeleteVolume(_ context.Context, team, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls["DeleteVolume"]++
	fv, ok := f.volumes[id]
	if !ok || fv.team != team {
		return fmt.Errorf("volume %s: %w", id, ErrNotFound)
	}
	if f.mounted[id] {
		return &ConflictError{Reason: "the volume is mounted by sandbox x"}
	}
	delete(f.volumes, id)
	return nil
}

// ServeVolumeContent answers with what it was asked, for the routing tests.
func (f *fakeBackend) ServeVolumeContent(w http.ResponseWriter, r *http.Request, team, id, kind string) {
	f.mu.Lock()
	f.calls["ServeVolumeContent"]++
	f.mu.Unlock()
	fmt.Fprintf(w, "%s %s %s %s %s", r.Method, team, id, kind, r.URL.Query().Get("path"))
}
