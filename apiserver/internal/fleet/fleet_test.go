package fleet_test

import (
	"encoding/json"
	"errors"
	"maps"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/skiff-dev/skiff/api/v1beta1"
	"github.com/skiff-dev/skiff/apiserver/internal/e2bapi"
	"github.com/skiff-dev/skiff/apiserver/internal/fleet"
	"github.com/skiff-dev/skiff/apiserver/internal/metrics"
	"github.com/skiff-dev/skiff/shared/inventory"
	"github.com/skiff-dev/skiff/shared/placement"
	sandboxdv1 "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
	"github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1/sandboxdv1connect"
	"github.com/skiff-dev/skiff/shared/sandboxid"
)

// harness is a fleet of fake nodes behind a StaticSource.
type harness struct {
	t *testing.T
	// direct publishes inventories as they are, as make up's static
	// source does, not through JSON.
	direct bool
	src    *inventory.StaticSource
	nodes  map[string]*fakeNode // by endpoint
	b      *fleet.Backend

	mu  sync.Mutex
	now time.Time
}

func newHarness(t *testing.T, nodes ...*fakeNode) *harness {
	t.Helper()
	return newHarnessWithMetrics(t, nil, nodes...)
}

// newHarnessWithMetrics is newHarness with a Backend that counts into m.
func newHarnessWithMetrics(t *testing.T, m *metrics.Metrics, nodes ...*fakeNode) *harness {
	t.Helper()
	return newHarnessWith(t, func(c *fleet.Config) { c.Metrics = m }, nodes...)
}

// newHarnessWith is newHarness with a Backend whose Config configure
// completes.
func newHarnessWith(t *testing.T, configure func(*fleet.Config), nodes ...*fakeNode) *harness {
	t.Helper()
	h := &harness{t: t, src: inventory.NewStaticSource(), nodes: map[string]*fakeNode{}, now: t0}
	for _, n := range nodes {
		h.nodes[n.endpoint()] = n
		h.publish(n)
	}
	cfg := fleet.Config{
		Source: h.src,
		Placer: placement.New(h.src, placement.Options{}),
		Clients: func(node, endpoint string) sandboxdv1connect.SandboxdServiceClient {
			n, ok := h.nodes[endpoint]
			if !ok {
				t.Errorf("client asked for unknown endpoint %s", endpoint)
				return newFakeNode("unknown")
			}
			if node != n.name { // the client carries the node's token
				t.Errorf("client for %s's endpoint asked as node %q", n.name, node)
			}
			return n
		},
		Now: func() time.Time {
			h.mu.Lock()
			defer h.mu.Unlock()
			return h.now
		},
	}
	configure(&cfg)
	h.b = fleet.New(cfg)
	return h
}

// publish applies n's inventory to the source, as its host's publisher
// would, through JSON as the API server and the informer pass it.
func (h *harness) publish(n *fakeNode) {
	h.t.Helper()
	if h.direct {
		h.src.Apply(n.inventory())
		return
	}
	data, err := json.Marshal(n.inventory())
	if err != nil {
		h.t.Fatal(err)
	}
	var inv v1beta1.NodeInventory
	if err := json.Unmarshal(data, &inv); err != nil {
		h.t.Fatal(err)
	}
	h.src.Apply(&inv)
}

func (h *harness) advance(d time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.now = h.now.Add(d)
}

func params(template string) e2bapi.CreateParams {
	return e2bapi.CreateParams{TemplateID: template, Timeout: 5 * time.Minute, Secure: true, AutoPauseMemory: true, Metadata: map[string]string{"k": "v"}}
}

func TestCreateCold(t *testing.T) {
	a, b := newFakeNode("node-a", "py"), newFakeNode("node-b", "base")
	h := newHarness(t, a, b)
	sb, err := h.b.Create(t.Context(), "team1", params("base"))
	if err != nil {
		t.Fatal(err)
	}
	if sb.Node != "node-b" || sb.EnvdAccessToken != "token-"+sb.ID || sb.EnvdVersion != "0.2.0" || sb.State != e2bapi.StateRunning ||
		sb.TemplateID != "base" || sb.CPUMilli != fleet.DefaultCPUMilli || sb.MemoryMB != fleet.DefaultMemoryMiB || sb.Metadata["k"] != "v" ||
		!sb.EndAt.Equal(t0.Add(5*time.Minute)) {
		t.Fatalf("Create = %+v, want a running base sandbox on node-b with its token", sb)
	}
	if tag, _ := sandboxid.Parse(sb.ID); tag != sandboxid.NodeTag("node-b") {
		t.Errorf("ID %s does not carry node-b's tag", sb.ID)
	}
	if a.callCount() != 0 {
		t.Errorf("node-a (no template) got calls %v", a.calls)
	}
}

// TestCreateBurstSpreads proves that creates in a row, with no publish
// between them, spread over the hosts as if each saw the ones before (the
// Backend tells placement what each create started), and that a kill
// through the Backend ends that count.
func TestCreateBurstSpreads(t *testing.T) {
	a, b := newFakeNode("node-a", "base"), newFakeNode("node-b", "base")
	// node-b has two sandboxes when the hosts publish.
	for range 2 {
		if _, err := b.Create(t.Context(), connect.NewRequest(&sandboxdv1.CreateRequest{Template: "base", Team: "team1", Timeout: durationpb.New(time.Hour),
			Resources: &sandboxdv1.Resources{CpuMilli: fleet.DefaultCPUMilli, MemoryMib: fleet.DefaultMemoryMiB}})); err != nil {
			t.Fatal(err)
		}
	}
	h := newHarness(t, a, b)
	on := map[string][]string{}
	for range 12 {
		sb, err := h.b.Create(t.Context(), "team1", params("base"))
		if err != nil {
			t.Fatal(err)
		}
		on[sb.Node] = append(on[sb.Node], sb.ID)
	}
	// Without the count, every one goes to node-a, the freer at the
	// publish.
	if d := len(on["node-a"]) - (2 + len(on["node-b"])); d < -1 || d > 1 {
		t.Fatalf("12 creates after a publish: %d on node-a (0 before), %d on node-b (2 before); want them even", len(on["node-a"]), len(on["node-b"]))
	}
	// Killed through the Backend, node-a's stop counting: the next creates
	// all go there, though no host published.
	for _, id := range on["node-a"] {
		if err := h.b.Kill(t.Context(), "team1", id); err != nil {
			t.Fatal(err)
		}
	}
	for range 4 {
		sb, err := h.b.Create(t.Context(), "team1", params("base"))
		if err != nil {
			t.Fatal(err)
		}
		if sb.Node != "node-a" {
			t.Fatalf("a create after node-a's sandboxes were killed went to %s, want node-a", sb.Node)
		}
	}
}

// TestForksCountAgainstTheirHost proves that the sandboxes a fork starts
// on its source's host count against that host until it publishes, as the
// creates placement made do: the creates right after go elsewhere.
func TestForksCountAgainstTheirHost(t *testing.T) {
	a, b := newFakeNode("node-a", "base"), newFakeNode("node-b", "base")
	h := newHarness(t, a, b)
	src, err := h.b.Create(t.Context(), "team1", params("base"))
	if err != nil {
		t.Fatal(err)
	}
	forked, other := b, a
	if src.Node == "node-a" {
		forked, other = a, b
	}
	forks, err := h.b.Fork(t.Context(), "team1", src.ID, 6, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range forks {
		if f.Err != nil || f.Sandbox.Node != forked.name {
			t.Fatalf("fork = %+v, %v; want a sandbox on %s", f.Sandbox, f.Err, forked.name)
		}
	}
	// The source's host now holds 7 to the other's 0; no host published.
	for i := range 6 {
		sb, err := h.b.Create(t.Context(), "team1", params("base"))
		if err != nil {
			t.Fatal(err)
		}
		if sb.Node != other.name {
			t.Fatalf("create %d after 6 forks on %s went there too; want %s", i, forked.name, other.name)
		}
	}
	// Killed through the Backend, the forks stop counting: the source's
	// host, with 1, is the freer again, though no host published.
	for _, f := range forks {
		if err := h.b.Kill(t.Context(), "team1", f.Sandbox.ID); err != nil {
			t.Fatal(err)
		}
	}
	if sb, err := h.b.Create(t.Context(), "team1", params("base")); err != nil || sb.Node != forked.name {
		t.Fatalf("a create after the forks were killed = %+v, %v; want one on %s", sb, err, forked.name)
	}
}

// TestSnapshotCreatesCountAgainstTheirHost proves the same of creates from
// a snapshot on the host that holds it (started there, not placed).
func TestSnapshotCreatesCountAgainstTheirHost(t *testing.T) {
	a, b := newFakeNode("node-a", "base"), newFakeNode("node-b", "base")
	b.snapshots = map[string]*sandboxdv1.CreateRequest{"snap-1": {Template: "base",
		Resources: &sandboxdv1.Resources{CpuMilli: fleet.DefaultCPUMilli, MemoryMib: fleet.DefaultMemoryMiB}}}
	h := newHarness(t, a, b)
	p := params("base")
	p.Snapshot = &e2bapi.Snapshot{ID: "snap-1", Team: "team1", Template: "base", Node: "node-b", Nodes: []string{"node-b"},
		CPUMilli: fleet.DefaultCPUMilli, MemoryMiB: fleet.DefaultMemoryMiB}
	for range 4 {
		sb, err := h.b.Create(t.Context(), "team1", p)
		if err != nil {
			t.Fatal(err)
		}
		if sb.Node != "node-b" {
			t.Fatalf("a create from a snapshot held by node-b went to %s", sb.Node)
		}
	}
	for i := range 4 {
		sb, err := h.b.Create(t.Context(), "team1", params("base"))
		if err != nil {
			t.Fatal(err)
		}
		if sb.Node != "node-a" {
			t.Fatalf("create %d after 4 from a snapshot on node-b went there too; want node-a", i)
		}
	}
}

func TestCreateWarm(t *testing.T) {
	a, b := newFakeNode("node-a", "base"), newFakeNode("node-b", "base")
	idA, idB := a.addWarm(t, "base"), b.addWarm(t, "base")
	a.claimed[idA], b.claimed[idB] = true, false
	h := newHarness(t, a, b)
	// One of the two candidates has been claimed by someone else: whichever
	// comes first, the create ends on idB.
	sb, err := h.b.Create(t.Context(), "team1", params("base"))
	if err != nil {
		t.Fatal(err)
	}
	if sb.ID != idB || sb.Node != "node-b" || sb.EnvdAccessToken != "token-"+idB || sb.Metadata["k"] != "v" {
		t.Fatalf("Create = %+v, want the warm %s on node-b", sb, idB)
	}
	if slices.Contains(a.calls, "Create") || slices.Contains(b.calls, "Create") {
		t.Errorf("a cold create was made: a %v, b %v", a.calls, b.calls)
	}

	// Every warm one conflicts: fall back to a cold create.
	h.publish(b)
	b.claimed[idB] = true
	sb, err = h.b.Create(t.Context(), "team1", params("base"))
	if err != nil || sb.ID == idA || sb.ID == idB {
		t.Fatalf("Create = %+v, %v; want a cold sandbox", sb, err)
	}
}

// TestCreateWarmNotClaimedTwice: the inventory lists a sandbox this replica
// has claimed as warm until its host publishes again; the next create must
// not spend a Claim on it.
func TestCreateWarmNotClaimedTwice(t *testing.T) {
	a := newFakeNode("node-a", "base")
	id := a.addWarm(t, "base")
	h := newHarness(t, a)
	sb, err := h.b.Create(t.Context(), "team1", params("base"))
	if err != nil || sb.ID != id {
		t.Fatalf("Create = %+v, %v; want the warm %s", sb, err, id)
	}
	// No publish: the source still lists id as warm.
	sb, err = h.b.Create(t.Context(), "team1", params("base"))
	if err != nil || sb.ID == id {
		t.Fatalf("second Create = %+v, %v; want a cold sandbox", sb, err)
	}
	claims := 0
	for _, c := range a.calls {
		if c == "Claim" {
			claims++
		}
	}
	if claims != 1 {
		t.Fatalf("node saw %d Claim calls (%v), want 1", claims, a.calls)
	}
}

func TestCreateWarmSkippedWithoutInternet(t *testing.T) {
	a := newFakeNode("node-a", "base")
	a.addWarm(t, "base")
	h := newHarness(t, a)
	p := params("base")
	no := false
	p.AllowInternetAccess = &no
	sb, err := h.b.Create(t.Context(), "team1", p)
	if err != nil || slices.Contains(a.calls, "Claim") || sb.AllowInternetAccess == nil || *sb.AllowInternetAccess {
		t.Fatalf("Create = %+v, %v after %v; want a cold sandbox without internet", sb, err, a.calls)
	}
}

func TestCreateFullRetried(t *testing.T) {
	a, b := newFakeNode("node-a", "base"), newFakeNode("node-b", "base")
	a.full = true
	h := newHarness(t, a, b)
	for range 5 {
		sb, err := h.b.Create(t.Context(), "team1", params("base"))
		if err != nil || sb.Node != "node-b" {
			t.Fatalf("Create = %+v, %v; want node-b", sb, err)
		}
	}
	b.down = true
	_, err := h.b.Create(t.Context(), "team1", params("base"))
	if !errors.Is(err, e2bapi.ErrCapacity) {
		t.Fatalf("Create with one node full and the other down = %v, want ErrCapacity", err)
	}
}

func TestCreateNoNode(t *testing.T) {
	h := newHarness(t, newFakeNode("node-a", "py"))
	if _, err := h.b.Create(t.Context(), "team1", params("base")); !errors.Is(err, e2bapi.ErrCapacity) {
		t.Fatalf("Create = %v, want ErrCapacity", err)
	}
}

func TestCreateInvalid(t *testing.T) {
	h := newHarness(t, newFakeNode("node-a", "base"))
	p := params("base")
	p.Metadata = map[string]string{"1": "", "2": "", "3": "", "4": "", "5": "", "6": "", "7": "", "8": "", "9": ""}
	_, err := h.b.Create(t.Context(), "team1", p)
	ie := new(e2bapi.InvalidError)
	if !errors.As(err, &ie) || ie.Field != "metadata" || ie.Reason != "at most 8 entries" {
		t.Fatalf("Create = %v, want an InvalidError on metadata", err)
	}
}

func TestGetTeamAndStale(t *testing.T) {
	a, b := newFakeNode("node-a", "base"), newFakeNode("node-b", "base")
	h := newHarness(t, a, b)
	sb, err := h.b.Create(t.Context(), "team1", params("base"))
	if err != nil {
		t.Fatal(err)
	}
	got, err := h.b.Get(t.Context(), "team1", sb.ID)
	if err != nil || got.ID != sb.ID || got.Node != sb.Node || got.EnvdAccessToken == "" || got.EnvdAccessToken != sb.EnvdAccessToken || got.TrafficAccessToken != "" {
		t.Fatalf("Get = %+v, %v; want the sandbox with its envd token (as e2b's GET), never a traffic token", got, err)
	}
	if _, err := h.b.Get(t.Context(), "team2", sb.ID); !errors.Is(err, e2bapi.ErrNotFound) {
		t.Fatalf("Get of another team's sandbox = %v, want ErrNotFound", err)
	}
	for _, op := range []func() error{
		func() error { return h.b.Kill(t.Context(), "team2", sb.ID) },
		func() error { return h.b.Pause(t.Context(), "team2", sb.ID, true) },
		func() error { return h.b.SetTimeout(t.Context(), "team2", sb.ID, time.Hour, false) },
		func() error { _, _, err := h.b.Connect(t.Context(), "team2", sb.ID, time.Hour, false); return err },
	} {
		if err := op(); !errors.Is(err, e2bapi.ErrNotFound) {
			t.Fatalf("an operation on another team's sandbox = %v, want ErrNotFound", err)
		}
	}
	if _, err := h.b.Get(t.Context(), "team1", "not-an-id"); !errors.Is(err, e2bapi.ErrNotFound) {
		t.Fatalf("Get of a malformed ID = %v, want ErrNotFound", err)
	}

	// The node goes stale: nothing is found and it is never called.
	node := h.nodes[sb.Node+":27777"]
	h.src.Remove(sb.Node)
	before := node.callCount()
	if _, err := h.b.Get(t.Context(), "team1", sb.ID); !errors.Is(err, e2bapi.ErrNotFound) {
		t.Fatalf("Get on a stale node = %v, want ErrNotFound", err)
	}
	if err := h.b.Kill(t.Context(), "team1", sb.ID); !errors.Is(err, e2bapi.ErrNotFound) {
		t.Fatalf("Kill on a stale node = %v, want ErrNotFound", err)
	}
	list, err := h.b.List(t.Context(), "team1", []e2bapi.State{e2bapi.StateRunning, e2bapi.StatePaused})
	if err != nil || len(list) != 0 {
		t.Fatalf("List with the node stale = %+v, %v; want nothing", list, err)
	}
	if node.callCount() != before {
		t.Fatalf("the stale node got calls %v", node.calls[before:])
	}
}

func TestReadYourWrites(t *testing.T) {
	a := newFakeNode("node-a", "base")
	h := newHarness(t, a)
	all := []e2bapi.State{e2bapi.StateRunning, e2bapi.StatePaused}
	sb, err := h.b.Create(t.Context(), "team1", params("base"))
	if err != nil {
		t.Fatal(err)
	}
	// The source has not been published since.
	if got, err := h.b.Get(t.Context(), "team1", sb.ID); err != nil || got.ID != sb.ID {
		t.Fatalf("Get right after Create = %+v, %v", got, err)
	}
	list, err := h.b.List(t.Context(), "team1", all)
	if err != nil || len(list) != 1 || list[0].ID != sb.ID || list[0].EnvdAccessToken != "" {
		t.Fatalf("List right after Create = %+v, %v; want the new sandbox without its token", list, err)
	}
	if list, _ := h.b.List(t.Context(), "team2", all); len(list) != 0 {
		t.Fatalf("List of team2 = %+v, want nothing", list)
	}
	// Pause, unpublished: List says paused.
	if err := h.b.Pause(t.Context(), "team1", sb.ID, true); err != nil {
		t.Fatal(err)
	}
	if list, _ := h.b.List(t.Context(), "team1", []e2bapi.State{e2bapi.StatePaused}); len(list) != 1 {
		t.Fatalf("List paused after Pause = %+v, want the sandbox", list)
	}
	h.publish(a)
	// Kill, unpublished: List forgets it at once.
	if err := h.b.Kill(t.Context(), "team1", sb.ID); err != nil {
		t.Fatal(err)
	}
	if list, _ := h.b.List(t.Context(), "team1", all); len(list) != 0 {
		t.Fatalf("List after Kill = %+v, want nothing", list)
	}
	if _, err := h.b.Get(t.Context(), "team1", sb.ID); !errors.Is(err, e2bapi.ErrNotFound) {
		t.Fatalf("Get after Kill = %v, want ErrNotFound", err)
	}
	// Once the memory expires, List follows the inventory (which still
	// lists it: the host never published).
	h.advance(fleet.DefaultRecentTTL)
	if list, _ := h.b.List(t.Context(), "team1", all); len(list) != 1 {
		t.Fatalf("List after the memory expired = %+v, want the inventory's entry", list)
	}
}

func TestConnect(t *testing.T) {
	a := newFakeNode("node-a", "base")
	h := newHarness(t, a)
	sb, err := h.b.Create(t.Context(), "team1", params("base")) // ends at t0+5m
	if err != nil {
		t.Fatal(err)
	}
	// Running, later end already: nothing changes.
	got, resumed, err := h.b.Connect(t.Context(), "team1", sb.ID, time.Minute, false)
	if err != nil || resumed || got.EnvdAccessToken != sb.EnvdAccessToken || !got.EndAt.Equal(t0.Add(5*time.Minute)) || slices.Contains(a.calls, "SetTimeout") {
		t.Fatalf("Connect(1m) = %+v, %v, %v after %v; want the sandbox unchanged with its token", got, resumed, err, a.calls)
	}
	// Running, earlier end: extended.
	got, resumed, err = h.b.Connect(t.Context(), "team1", sb.ID, time.Hour, false)
	if err != nil || resumed || !got.EndAt.Equal(t0.Add(time.Hour)) || got.EnvdAccessToken == "" {
		t.Fatalf("Connect(1h) = %+v, %v, %v; want the end at t0+1h", got, resumed, err)
	}
	// Paused: resumed.
	if err := h.b.Pause(t.Context(), "team1", sb.ID, false); err != nil {
		t.Fatal(err)
	}
	got, resumed, err = h.b.Connect(t.Context(), "team1", sb.ID, 2*time.Minute, false)
	if err != nil || !resumed || got.State != e2bapi.StateRunning || !got.EndAt.Equal(t0.Add(2*time.Minute)) || got.EnvdAccessToken != sb.EnvdAccessToken {
		t.Fatalf("Connect on paused = %+v, %v, %v; want resumed, ending at t0+2m, with the token", got, resumed, err)
	}
}

func TestPauseTwice(t *testing.T) {
	h := newHarness(t, newFakeNode("node-a", "base"))
	sb, err := h.b.Create(t.Context(), "team1", params("base"))
	if err != nil {
		t.Fatal(err)
	}
	if err := h.b.Pause(t.Context(), "team1", sb.ID, true); err != nil {
		t.Fatal(err)
	}
	if err := h.b.Pause(t.Context(), "team1", sb.ID, true); !errors.Is(err, e2bapi.ErrConflict) {
		t.Fatalf("second Pause = %v, want ErrConflict", err)
	}
}

// A pause sandboxd refuses is ErrConflict only when the sandbox is paused
// now; a refusal of a sandbox that runs on is a 400 with sandboxd's reason,
// and one of a sandbox killed meanwhile is ErrNotFound.
func TestPauseRefused(t *testing.T) {
	a := newFakeNode("node-a", "base")
	h := newHarness(t, a)
	sb, err := h.b.Create(t.Context(), "team1", params("base"))
	if err != nil {
		t.Fatal(err)
	}
	const tooLarge = "Sandbox cannot be paused: under gVisor each file is copied through the sandbox's own memory"
	for _, tc := range []struct {
		name   string
		refuse func(n *fakeNode, id string) error
		check  func(err error) bool
	}{
		{"files too large", func(*fakeNode, string) error {
			return connect.NewError(connect.CodeFailedPrecondition, errors.New(tooLarge))
		}, func(err error) bool {
			inv := new(e2bapi.InvalidError)
			return errors.As(err, &inv) && inv.Error() == tooLarge && !errors.Is(err, e2bapi.ErrConflict)
		}},
		{"paused meanwhile", func(n *fakeNode, id string) error {
			n.sandboxes[id].State = sandboxdv1.SandboxState_SANDBOX_STATE_PAUSED
			return connect.NewError(connect.CodeFailedPrecondition, errors.New("sandbox is paused, not running"))
		}, func(err error) bool { return errors.Is(err, e2bapi.ErrConflict) }},
		{"killed meanwhile", func(n *fakeNode, id string) error {
			delete(n.sandboxes, id)
			return connect.NewError(connect.CodeFailedPrecondition, errors.New("sandbox is stopping, not running"))
		}, func(err error) bool { return errors.Is(err, e2bapi.ErrNotFound) && !errors.Is(err, e2bapi.ErrConflict) }},
	} {
		a.mu.Lock()
		a.refusePause = tc.refuse
		a.sandboxes[sb.ID].State = sandboxdv1.SandboxState_SANDBOX_STATE_RUNNING
		a.mu.Unlock()
		if err := h.b.Pause(t.Context(), "team1", sb.ID, true); !tc.check(err) {
			t.Errorf("%s: Pause = %v", tc.name, err)
		}
	}
}

func TestSetTimeout(t *testing.T) {
	h := newHarness(t, newFakeNode("node-a", "base"))
	sb, err := h.b.Create(t.Context(), "team1", params("base"))
	if err != nil {
		t.Fatal(err)
	}
	check := func(timeout time.Duration, onlyExtend bool, want time.Duration) {
		t.Helper()
		if err := h.b.SetTimeout(t.Context(), "team1", sb.ID, timeout, onlyExtend); err != nil {
			t.Fatal(err)
		}
		got, err := h.b.Get(t.Context(), "team1", sb.ID)
		if err != nil || !got.EndAt.Equal(t0.Add(want)) {
			t.Fatalf("after SetTimeout(%s, %v): %+v, %v; want the end at t0+%s", timeout, onlyExtend, got, err, want)
		}
	}
	check(time.Minute, true, 5*time.Minute)
	check(time.Minute, false, time.Minute)
	check(time.Hour, true, time.Hour)
}

// The host bounds a new end by the sandbox's last start + the longest
// lifetime (Config.MaxLifetime), given with each call, with only_extend
// for a refresh or a connect; a sandbox that has run that long is a 400 in
// e2b's words.
func TestSetTimeoutMaxLifetime(t *testing.T) {
	a := newFakeNode("node-a", "base")
	h := newHarnessWith(t, func(c *fleet.Config) { c.MaxLifetime = 2 * time.Hour }, a)
	sb, err := h.b.Create(t.Context(), "team1", params("base"))
	if err != nil {
		t.Fatal(err)
	}
	for i, onlyExtend := range []bool{false, true} {
		if err := h.b.SetTimeout(t.Context(), "team1", sb.ID, time.Duration(i+1)*time.Hour, onlyExtend); err != nil {
			t.Fatal(err)
		}
		if m := a.lastSetTimeout; m.GetMaxLifetime().AsDuration() != 2*time.Hour || m.GetOnlyExtend() != onlyExtend {
			t.Errorf("SetTimeout(only extend %v) asked the host %v", onlyExtend, m)
		}
	}
	a.refuseSetTimeout = connect.NewError(connect.CodeOutOfRange, errors.New("sandbox x has run for its longest lifetime of 2h0m0s"))
	var inv *e2bapi.InvalidError
	if err := h.b.SetTimeout(t.Context(), "team1", sb.ID, 3*time.Hour, false); !errors.As(err, &inv) || inv.Error() != "Max instance length exceeded" {
		t.Fatalf("SetTimeout past the longest = %v; want e2b's 400", err)
	}
}

// A timeout of 0 ends the sandbox now, as e2b's API does: killed, or with
// auto-pause paused (keeping its memory), here, not by a deadline of now
// at sandboxd, which would leave it a last timeout of ~0 for auto-resume
// to give it. List says so at once; a paused sandbox is a 404, as for any
// timeout.
func TestSetTimeoutZeroEndsTheSandbox(t *testing.T) {
	a := newFakeNode("node-a", "base")
	h := newHarness(t, a)
	killed, err := h.b.Create(t.Context(), "team1", params("base"))
	if err != nil {
		t.Fatal(err)
	}
	p := params("base")
	p.AutoPause, p.AutoResume = true, true
	paused, err := h.b.Create(t.Context(), "team1", p)
	if err != nil {
		t.Fatal(err)
	}
	a.calls = nil
	for _, id := range []string{killed.ID, paused.ID} {
		if err := h.b.SetTimeout(t.Context(), "team1", id, 0, false); err != nil {
			t.Fatalf("SetTimeout(0) = %v", err)
		}
	}
	if slices.Contains(a.calls, "SetTimeout") || !slices.Contains(a.calls, "Kill") || !slices.Contains(a.calls, "Pause") || a.pausedFilesOnly {
		t.Fatalf("calls %v (files only: %v), want a kill and a pause that keeps the memory, and no deadline", a.calls, a.pausedFilesOnly)
	}
	if _, err := h.b.Get(t.Context(), "team1", killed.ID); !errors.Is(err, e2bapi.ErrNotFound) {
		t.Errorf("Get of the sandbox without auto-pause = %v, want ErrNotFound", err)
	}
	if got, err := h.b.Get(t.Context(), "team1", paused.ID); err != nil || got.State != e2bapi.StatePaused {
		t.Errorf("Get of the sandbox with auto-pause = %+v, %v; want it paused", got, err)
	}
	list, err := h.b.List(t.Context(), "team1", []e2bapi.State{e2bapi.StateRunning, e2bapi.StatePaused})
	if err != nil || len(list) != 1 || list[0].ID != paused.ID || list[0].State != e2bapi.StatePaused {
		t.Errorf("List = %+v, %v; want only the auto-paused sandbox, paused", list, err)
	}
	// As e2b's API, whose store of sandboxes with a deadline has no paused
	// ones: 404, whatever the timeout, and for a refresh too.
	for _, tc := range []struct {
		timeout    time.Duration
		onlyExtend bool
	}{{0, false}, {time.Minute, false}, {time.Minute, true}} {
		if err := h.b.SetTimeout(t.Context(), "team1", paused.ID, tc.timeout, tc.onlyExtend); !errors.Is(err, e2bapi.ErrNotFound) {
			t.Errorf("SetTimeout(%s, onlyExtend %v) of a paused sandbox = %v, want ErrNotFound", tc.timeout, tc.onlyExtend, err)
		}
	}
	// Paused between the lookup and the deadline: sandboxd refuses, and
	// that is a 404 too.
	running, err := h.b.Create(t.Context(), "team1", params("base"))
	if err != nil {
		t.Fatal(err)
	}
	a.refuseSetTimeout = connect.NewError(connect.CodeFailedPrecondition, errors.New("only a running sandbox has a deadline"))
	if err := h.b.SetTimeout(t.Context(), "team1", running.ID, time.Minute, false); !errors.Is(err, e2bapi.ErrNotFound) {
		t.Errorf("SetTimeout of a sandbox paused meanwhile = %v, want ErrNotFound", err)
	}
}

// A timeout of 0 for an auto-pause sandbox that was paused between the
// lookup and the pause is a 404, as for any timeout of a paused sandbox.
func TestSetTimeoutZeroPausedMeanwhile(t *testing.T) {
	a := newFakeNode("node-a", "base")
	h := newHarness(t, a)
	p := params("base")
	p.AutoPause = true
	sb, err := h.b.Create(t.Context(), "team1", p)
	if err != nil {
		t.Fatal(err)
	}
	a.refusePause = func(n *fakeNode, id string) error {
		n.sandboxes[id].State = sandboxdv1.SandboxState_SANDBOX_STATE_PAUSED
		return connect.NewError(connect.CodeFailedPrecondition, errors.New("sandbox is paused, not running"))
	}
	if err := h.b.SetTimeout(t.Context(), "team1", sb.ID, 0, false); !errors.Is(err, e2bapi.ErrNotFound) {
		t.Fatalf("SetTimeout(0) of a sandbox paused meanwhile = %v, want ErrNotFound", err)
	}
}

// A timeout of 0 pauses a sandbox created with autoPauseMemory: false
// with its files only, as its deadline would.
func TestSetTimeoutZeroPausesFilesOnly(t *testing.T) {
	a := newFakeNode("node-a", "base")
	h := newHarness(t, a)
	p := params("base")
	p.AutoPause, p.AutoPauseMemory = true, false
	sb, err := h.b.Create(t.Context(), "team1", p)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.b.SetTimeout(t.Context(), "team1", sb.ID, 0, false); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(a.calls, "Pause") || !a.pausedFilesOnly {
		t.Fatalf("calls %v (files only: %v), want a pause with the files only", a.calls, a.pausedFilesOnly)
	}
}

// A connect with a timeout of 0 only extends by nothing: a running
// sandbox's end stays as it is, even when it is unknown or past by this
// replica's clock (sent on, the 0 would end the sandbox), and a paused
// one is not resumed (400).
func TestConnectZeroTimeout(t *testing.T) {
	a := newFakeNode("node-a", "base")
	h := newHarness(t, a)
	sb, err := h.b.Create(t.Context(), "team1", params("base"))
	if err != nil {
		t.Fatal(err)
	}
	for _, end := range []*timestamppb.Timestamp{nil, timestamppb.New(t0.Add(-time.Hour)), timestamppb.New(t0.Add(time.Hour))} {
		a.mu.Lock()
		a.sandboxes[sb.ID].EndAt = end
		a.calls = nil
		a.mu.Unlock()
		got, resumed, err := h.b.Connect(t.Context(), "team1", sb.ID, 0, false)
		if err != nil || resumed || got.State != e2bapi.StateRunning || got.EnvdAccessToken == "" {
			t.Fatalf("Connect(0) of a running sandbox ending %v = %+v, %v, %v", end, got, resumed, err)
		}
		a.mu.Lock()
		calls, left := slices.Clone(a.calls), a.sandboxes[sb.ID]
		a.mu.Unlock()
		if slices.Contains(calls, "SetTimeout") || left == nil || !proto.Equal(left.GetEndAt(), end) {
			t.Fatalf("Connect(0) of a sandbox ending %v: calls %v, and it is now %v", end, calls, left)
		}
	}
	if err := h.b.Pause(t.Context(), "team1", sb.ID, true); err != nil {
		t.Fatal(err)
	}
	a.mu.Lock()
	a.calls = nil
	a.mu.Unlock()
	_, _, err = h.b.Connect(t.Context(), "team1", sb.ID, 0, false)
	if inv := new(e2bapi.InvalidError); !errors.As(err, &inv) || inv.Field != "timeout" {
		t.Fatalf("Connect(0) of a paused sandbox = %v, want a 400 naming timeout", err)
	}
	if slices.Contains(a.calls, "Resume") {
		t.Fatal("Connect(0) resumed a paused sandbox")
	}
}

func TestListFiltersTeamAndState(t *testing.T) {
	a, b := newFakeNode("node-a", "base"), newFakeNode("node-b", "base")
	a.addWarm(t, "base")
	h := newHarness(t, a, b)
	var ids []string
	for _, team := range []string{"team1", "team1", "team2"} {
		sb, err := h.b.Create(t.Context(), team, params("base"))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, sb.ID)
	}
	if err := h.b.Pause(t.Context(), "team1", ids[1], true); err != nil {
		t.Fatal(err)
	}
	h.publish(a)
	h.publish(b)
	h.advance(fleet.DefaultRecentTTL) // the inventory alone now
	for _, tc := range []struct {
		team   string
		states []e2bapi.State
		want   []string
	}{
		{"team1", []e2bapi.State{e2bapi.StateRunning}, []string{ids[0]}},
		{"team1", []e2bapi.State{e2bapi.StatePaused}, []string{ids[1]}},
		{"team1", []e2bapi.State{e2bapi.StateRunning, e2bapi.StatePaused}, []string{ids[0], ids[1]}},
		{"team2", []e2bapi.State{e2bapi.StateRunning, e2bapi.StatePaused}, []string{ids[2]}},
		{"team3", []e2bapi.State{e2bapi.StateRunning}, nil},
	} {
		list, err := h.b.List(t.Context(), tc.team, tc.states)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, sb := range list {
			got = append(got, sb.ID)
		}
		if !slices.Equal(slices.Sorted(slices.Values(got)), slices.Sorted(slices.Values(tc.want))) {
			t.Errorf("List(%s, %v) = %v, want %v", tc.team, tc.states, got, tc.want)
		}
	}
}

// TestListedMetadataIsTheCallers: List and Get read the source's objects
// without copies (ListNodesShared), so what they return must not share
// memory with the source: writing to a listed sandbox's metadata changes
// no later answer.
func TestListedMetadataIsTheCallers(t *testing.T) {
	a := newFakeNode("node-a", "base")
	h := newHarness(t, a)
	sb, err := h.b.Create(t.Context(), "team1", params("base"))
	if err != nil {
		t.Fatal(err)
	}
	h.publish(a)
	h.advance(fleet.DefaultRecentTTL) // answered from the inventory alone
	list, err := h.b.List(t.Context(), "team1", []e2bapi.State{e2bapi.StateRunning})
	if err != nil || len(list) != 1 || list[0].ID != sb.ID || list[0].Metadata["k"] != "v" {
		t.Fatalf("List = %+v, %v; want %s with k=v", list, err, sb.ID)
	}
	list[0].Metadata["k"] = "written by the caller"
	got, err := h.b.Get(t.Context(), "team1", sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	got.Metadata["k"] = "written by the caller too"
	again, err := h.b.List(t.Context(), "team1", []e2bapi.State{e2bapi.StateRunning})
	if err != nil || len(again) != 1 || again[0].Metadata["k"] != "v" {
		t.Fatalf("List after the caller wrote to an answer = %+v, %v; want k=v", again, err)
	}
}

func TestMetricsLogs(t *testing.T) {
	h := newHarness(t, newFakeNode("node-a", "base"))
	sb, err := h.b.Create(t.Context(), "team1", params("base"))
	if err != nil {
		t.Fatal(err)
	}
	m, err := h.b.Metrics(t.Context(), "team1", sb.ID)
	if err != nil || len(m) != 1 || m[0].CPUCount != 2 || !m[0].Timestamp.Equal(t0) {
		t.Fatalf("Metrics = %+v, %v", m, err)
	}
	logs, err := h.b.Logs(t.Context(), "team1", sb.ID, e2bapi.LogQuery{Start: t0, End: t0.Add(time.Hour), Limit: 10, Forward: true, MinLevel: "warn", Search: "he"})
	if err != nil || len(logs) != 1 || logs[0].Line != "hello" || logs[0].Source != "stdout" || logs[0].Level != "warn" {
		t.Fatalf("Logs = %+v, %v", logs, err)
	}
	if r := h.nodes[sb.Node+":27777"].lastLogs; !r.GetStart().AsTime().Equal(t0) || !r.GetEnd().AsTime().Equal(t0.Add(time.Hour)) || r.GetLimit() != 10 ||
		!r.GetForward() || r.GetMinLevel() != "warn" || r.GetSearch() != "he" {
		t.Errorf("the host was asked %v", r)
	}
	if _, err := h.b.Metrics(t.Context(), "team2", sb.ID); !errors.Is(err, e2bapi.ErrNotFound) {
		t.Fatalf("Metrics of another team = %v, want ErrNotFound", err)
	}
}

func TestTemplates(t *testing.T) {
	h := newHarness(t, newFakeNode("node-a", "base", "py"), newFakeNode("node-b", "base", "go"))
	list, err := h.b.Templates(t.Context(), "team1")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tm := range list {
		names = append(names, tm.ID)
		if tm.Aliases == nil || len(tm.Aliases) != 0 {
			t.Errorf("template %s aliases = %#v, want an empty list", tm.ID, tm.Aliases)
		}
	}
	if !slices.Equal(names, []string{"base", "go", "py"}) {
		t.Fatalf("Templates = %v, want base, go, py", names)
	}
	if tm, err := h.b.Template(t.Context(), "team1", "go"); err != nil || tm.ID != "go" || tm.Version != "v1" {
		t.Fatalf("Template(go) = %+v, %v", tm, err)
	}
	h.src.Remove("node-b")
	if _, err := h.b.Template(t.Context(), "team1", "go"); !errors.Is(err, e2bapi.ErrNotFound) {
		t.Fatalf("Template(go) with node-b stale = %v, want ErrNotFound", err)
	}
}

// TestSharedTag proves a sandbox is found on the node that lists it when two
// fresh nodes share its tag, and on the other one when neither lists it.
func TestSharedTag(t *testing.T) {
	// Node names that share a tag are found by brute force, in a few
	// thousand tries at most.
	seen := map[string]string{}
	var n1, n2 string
	for i := 0; n1 == ""; i++ {
		name := "node-" + strconv.Itoa(i)
		tag := string(sandboxid.NodeTag(name))
		if other, ok := seen[tag]; ok {
			n1, n2 = other, name
		}
		seen[tag] = name
	}
	a, b := newFakeNode(n1, "base"), newFakeNode(n2, "base")
	h := newHarness(t, a, b)
	b.full = false
	a.full = true
	sb, err := h.b.Create(t.Context(), "team1", params("base"))
	if err != nil || sb.Node != n2 {
		t.Fatalf("Create = %+v, %v; want it on %s", sb, err, n2)
	}
	h.publish(b)
	h.advance(fleet.DefaultRecentTTL)
	before := a.callCount()
	if got, err := h.b.Get(t.Context(), "team1", sb.ID); err != nil || got.Node != n2 {
		t.Fatalf("Get = %+v, %v; want it on %s", got, err, n2)
	}
	if a.callCount() != before {
		t.Errorf("the node that does not list the sandbox was asked first: %v", a.calls[before:])
	}
}

// TestCreateHostLacksTemplate proves a host whose inventory lists a template
// it does not hold (a lagging inventory) is skipped like a full one.
func TestCreateHostLacksTemplate(t *testing.T) {
	a, b := newFakeNode("node-a", "base"), newFakeNode("node-b", "base")
	h := newHarness(t, a, b)
	a.templates = nil // the inventory still lists base
	for range 5 {
		sb, err := h.b.Create(t.Context(), "team1", params("base"))
		if err != nil || sb.Node != "node-b" {
			t.Fatalf("Create = %+v, %v; want node-b", sb, err)
		}
	}
}

// An inventory that lists other nodes' sandboxes (a lying or compromised
// host) shows none of them in lists, and its warm entries for them are
// never claimed through it: they would be that host answering for another
// node's sandbox (inventory.Owned).
func TestForeignEntriesIgnored(t *testing.T) {
	a, b := newFakeNode("node-a", "base"), newFakeNode("node-b", "base")
	b.full = true // creates stay on node-a; node-b's sandboxes are made by hand
	h := newHarness(t, a, b)
	warmB := b.addWarm(t, "base")
	b.mu.Lock()
	runB, err := sandboxid.New(sandboxid.NodeTag("node-b"))
	if err != nil {
		t.Fatal(err)
	}
	b.sandboxes[runB] = &sandboxdv1.Sandbox{Id: runB, Template: "base", State: sandboxdv1.SandboxState_SANDBOX_STATE_RUNNING, Team: "team1"}
	b.mu.Unlock()
	h.publish(b)
	// node-a's inventory claims node-b's running sandbox, and its warm one.
	lie := a.inventory()
	lie.Spec.Sandboxes = append(lie.Spec.Sandboxes, b.inventory().Spec.Sandboxes...)
	h.src.Apply(lie)

	list, err := h.b.List(t.Context(), "team1", []e2bapi.State{e2bapi.StateRunning})
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].ID != runB || list[0].Node != "node-b" {
		t.Errorf("List = %+v, want %s once, on node-b", list, runB)
	}

	b.full = false
	b.claimed[warmB] = true // node-b's own answer: the claim conflicts, so a cold create follows
	a.full = true
	sb, err := h.b.Create(t.Context(), "team1", params("base"))
	if err != nil || sb.Node != "node-b" {
		t.Fatalf("Create = %+v, %v; want a cold create on node-b", sb, err)
	}
	if slices.Contains(a.calls, "Claim") {
		t.Errorf("node-a was asked to claim node-b's warm sandbox: %v", a.calls)
	}
}

// A host that stops answering, and is not yet stale: a get answers the
// last record its inventory published, a kill ErrUnavailable (503, for the
// client to retry), never an internal error; the other team still gets
// 404.
func TestHostUnreachable(t *testing.T) {
	a := newFakeNode("node-a", "base")
	h := newHarness(t, a)
	sb, err := h.b.Create(t.Context(), "team1", params("base"))
	if err != nil {
		t.Fatal(err)
	}
	h.publish(a)
	a.mu.Lock()
	a.down = true
	a.mu.Unlock()
	got, err := h.b.Get(t.Context(), "team1", sb.ID)
	if err != nil || got.ID != sb.ID || got.State != e2bapi.StateRunning || got.Node != "node-a" {
		t.Fatalf("Get on a silent host = %+v, %v; want the published record", got, err)
	}
	if err := h.b.Kill(t.Context(), "team1", sb.ID); !errors.Is(err, e2bapi.ErrUnavailable) {
		t.Errorf("Kill on a silent host = %v, want ErrUnavailable", err)
	}
	if _, err := h.b.Get(t.Context(), "team2", sb.ID); !errors.Is(err, e2bapi.ErrUnavailable) && !errors.Is(err, e2bapi.ErrNotFound) {
		t.Errorf("Get by another team = %v", err)
	} else if got, _ := h.b.Get(t.Context(), "team2", sb.ID); got != nil {
		t.Errorf("another team got the record %+v", got)
	}
}

// TestListAgreesWithGet: every field the SDKs read of a listed sandbox is
// the one GET gives (from its host), with the inventory alone behind the
// list: envd version (the node's, left out of the entry), resources, disk,
// template, times, metadata, state.
func TestListAgreesWithGet(t *testing.T) {
	for _, direct := range []bool{false, true} {
		t.Run(map[bool]string{false: "inventory through JSON", true: "static inventory"}[direct], func(t *testing.T) {
			testListAgreesWithGet(t, direct)
		})
	}
}

func testListAgreesWithGet(t *testing.T, direct bool) {
	a := newFakeNode("node-a", "base")
	a.frac = 700*time.Millisecond + 123_456 // sandboxd's clock has nanoseconds
	h := newHarness(t)
	h.nodes[a.endpoint()] = a
	h.direct = direct
	h.publish(a)
	sb, err := h.b.Create(t.Context(), "team1", params("base"))
	if err != nil {
		t.Fatal(err)
	}
	// The host gave it its default disk (sandboxd --default-disk).
	a.mu.Lock()
	res := proto.CloneOf(a.sandboxes[sb.ID].GetResources())
	res.DiskMib = 10240
	a.sandboxes[sb.ID].Resources = res
	a.mu.Unlock()
	h.publish(a)
	h.advance(fleet.DefaultRecentTTL) // the inventory alone now
	list, err := h.b.List(t.Context(), "team1", []e2bapi.State{e2bapi.StateRunning})
	if err != nil || len(list) != 1 {
		t.Fatalf("List = %v, %v", list, err)
	}
	got, err := h.b.Get(t.Context(), "team1", sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	l := list[0]
	for _, f := range []struct {
		name       string
		list, want any
	}{
		{"envdVersion", l.EnvdVersion, got.EnvdVersion},
		{"cpu", l.CPUMilli, got.CPUMilli},
		{"memory", l.MemoryMB, got.MemoryMB},
		{"disk", l.DiskMB, got.DiskMB},
		{"template", l.TemplateID, got.TemplateID},
		{"state", l.State, got.State},
		{"node", l.Node, got.Node},
		{"startedAt", l.StartedAt.UnixNano(), got.StartedAt.UnixNano()},
		{"endAt", l.EndAt.UnixNano(), got.EndAt.UnixNano()},
		{"metadata", maps.Equal(l.Metadata, got.Metadata), true},
	} {
		if f.list != f.want {
			t.Errorf("%s: list %v, get %v", f.name, f.list, f.want)
		}
	}
	if got.EnvdVersion == "" || got.DiskMB != 10240 {
		t.Errorf("get: envd %q, disk %d", got.EnvdVersion, got.DiskMB)
	}
}

// A sandbox's listed start does not move when the inventory (microseconds,
// as v1beta1.MicroTime goes through JSON) takes over from this replica's
// write (sandboxd's clock, nanoseconds): the listing's cursor is the last
// sandbox's start and ID, and a start that moved between two pages listed
// a sandbox on both (the SDK suite's pagination test, through the fleet).
func TestListedStartStaysWhenTheInventoryTakesOver(t *testing.T) {
	a := newFakeNode("node-a", "base")
	a.frac = 700*time.Millisecond + 123_456
	h := newHarness(t, a)
	var ids []string
	for range 3 {
		sb, err := h.b.Create(t.Context(), "team1", params("base"))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, sb.ID)
	}
	starts := func() map[string]time.Time {
		t.Helper()
		list, err := h.b.List(t.Context(), "team1", []e2bapi.State{e2bapi.StateRunning})
		if err != nil || len(list) != len(ids) {
			t.Fatalf("List = %v, %v", list, err)
		}
		out := map[string]time.Time{}
		for _, sb := range list {
			out[sb.ID] = sb.StartedAt
		}
		return out
	}
	before := starts()
	h.publish(a)
	h.advance(fleet.DefaultRecentTTL) // the inventory alone now
	after := starts()
	for _, id := range ids {
		if !before[id].Equal(after[id]) {
			t.Errorf("%s started at %v while this replica's write listed it, at %v once the inventory did", id, before[id], after[id])
		}
	}
}

// A host whose volume store is below its disk reserve is asked for a new
// volume only when no other host takes it: its inventory says it would
// refuse. With every host full, each is asked and the answer is capacity.
func TestCreateVolumeSkipsFullHost(t *testing.T) {
	a, b := newFakeNode("node-a", "base"), newFakeNode("node-b", "base")
	b.volumesFull = true
	h := newHarness(t, a, b)
	for i := range 8 {
		name := "vol-" + strconv.Itoa(i)
		v, err := h.b.CreateVolume(t.Context(), "team1", name)
		if err != nil || v.Name != name {
			t.Fatalf("CreateVolume(%s) = %+v, %v", name, v, err)
		}
	}
	if len(a.volumes) != 8 || slices.Contains(b.calls, "CreateVolume") {
		t.Fatalf("node-a made %v; node-b, full, was asked: %v", a.volumes, b.calls)
	}
	a.volumesFull = true
	h.publish(a)
	_, err := h.b.CreateVolume(t.Context(), "team1", "one-more")
	if !errors.Is(err, e2bapi.ErrCapacity) || !slices.Contains(a.calls[len(a.calls)-1:], "CreateVolume") || !slices.Contains(b.calls, "CreateVolume") {
		t.Fatalf("CreateVolume with both full = %v (calls: %v, %v), want ErrCapacity after asking both", err, a.calls, b.calls)
	}
}

// A paused sandbox ends, to e2b's API, when it paused: its Get and its
// listed entry (from its host's inventory) say so, not the deadline its
// host keeps for a resume.
func TestPausedEndsWhenPaused(t *testing.T) {
	a := newFakeNode("node-a", "base")
	h := newHarness(t, a)
	sb, err := h.b.Create(t.Context(), "team1", params("base"))
	if err != nil {
		t.Fatal(err)
	}
	if err := h.b.Pause(t.Context(), "team1", sb.ID, true); err != nil {
		t.Fatal(err)
	}
	pausedAt := t0.Add(time.Minute) // the fake's
	if got, err := h.b.Get(t.Context(), "team1", sb.ID); err != nil || got.State != e2bapi.StatePaused || !got.EndAt.Equal(pausedAt) {
		t.Fatalf("Get of the paused sandbox = %+v, %v; want its end at its pause", got, err)
	}
	h.publish(a)
	h.advance(fleet.DefaultRecentTTL) // the inventory alone now
	list, err := h.b.List(t.Context(), "team1", []e2bapi.State{e2bapi.StatePaused})
	if err != nil || len(list) != 1 || list[0].State != e2bapi.StatePaused || !list[0].EndAt.Equal(pausedAt) {
		t.Fatalf("List = %+v, %v; want the paused sandbox, its end at its pause", list, err)
	}
}
