package service

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/skiff-dev/skiff/sandboxd/internal/sandboxrt"
	"github.com/skiff-dev/skiff/sandboxd/internal/service/servicetest"
	pb "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
)

const testPool = "team-a/warm"

func (h *harness) warm(n int) []string {
	h.t.Helper()
	var ids []string
	for range n {
		resp, err := h.client.Warm(h.t.Context(), connect.NewRequest(&pb.WarmRequest{Template: testTemplate, Pool: testPool}))
		if err != nil {
			h.t.Fatalf("Warm: %v", err)
		}
		sb := resp.Msg.GetSandbox()
		if sb.GetState() != pb.SandboxState_SANDBOX_STATE_WARM || sb.GetTeam() != "" || sb.GetEndAt() != nil || sb.GetPool() != testPool {
			h.t.Fatalf("warm sandbox = %v", sb)
		}
		ids = append(ids, sb.GetId())
	}
	return ids
}

func claimReq(m *pb.ClaimRequest) *connect.Request[pb.ClaimRequest] {
	if m.Timeout == nil {
		m.Timeout = durationpb.New(10 * time.Minute)
	}
	if m.Team == "" {
		m.Team = "team-b"
	}
	return connect.NewRequest(m)
}

// TestClaimAnyConcurrent: 100 claims race for 10 warm sandboxes of a pool.
// Exactly 10 win, each a different sandbox, and each winner's token is the
// one the sandbox's envd now holds, not the warm one.
func TestClaimAnyConcurrent(t *testing.T) {
	h := newHarness(t, harnessConfig{})
	ids := h.warm(10)
	warmTokens := map[string]string{}
	for _, id := range ids {
		rec, _ := h.reg.Get(id)
		warmTokens[id] = rec.EnvdAccessToken
	}

	type win struct{ id, token string }
	var (
		mu     sync.Mutex
		wins   []win
		misses int
		wg     sync.WaitGroup
	)
	for range 100 {
		wg.Go(func() {
			// e2b's own names stay e2b's.
			resp, err := h.client.Claim(t.Context(), claimReq(&pb.ClaimRequest{Pool: testPool, EnvVars: map[string]string{"OWNER": "b", "E2B_SANDBOX_ID": "mine"}}))
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				wins = append(wins, win{resp.Msg.GetSandbox().GetId(), resp.Msg.GetEnvdAccessToken()})
			case connect.CodeOf(err) == connect.CodeNotFound:
				misses++
			default:
				t.Errorf("Claim: %v", err)
			}
		})
	}
	wg.Wait()
	if len(wins) != 10 || misses != 90 {
		t.Fatalf("%d claims won and %d missed, want 10 and 90", len(wins), misses)
	}
	seen := map[string]bool{}
	for _, w := range wins {
		if seen[w.id] {
			t.Fatalf("sandbox %s claimed twice", w.id)
		}
		seen[w.id] = true
		e := h.rt.Envd(w.id)
		st := e.State()
		token, inits, owner := st.Token, st.Inits, st.Env["OWNER"]
		if token != w.token || w.token == warmTokens[w.id] || inits != 2 || owner != "b" || st.Env["E2B_SANDBOX_ID"] != w.id {
			t.Fatalf("sandbox %s: envd token matches %v, warm token reused %v, %d inits, OWNER=%q, E2B_SANDBOX_ID=%q",
				w.id, token == w.token, w.token == warmTokens[w.id], inits, owner, st.Env["E2B_SANDBOX_ID"])
		}
		sb, err := h.get(w.id)
		if err != nil || sb.GetState() != pb.SandboxState_SANDBOX_STATE_RUNNING || sb.GetTeam() != "team-b" ||
			!sb.GetEndAt().AsTime().Equal(epoch.Add(10*time.Minute)) {
			t.Fatalf("claimed sandbox = %v, %v", sb, err)
		}
		if _, ok := h.svc.deadlines.Deadline(w.id); !ok {
			t.Fatalf("claimed sandbox %s has no deadline", w.id)
		}
	}
}

// TestClaimWithoutEnvHandsWarmToken: a claim without environment variables
// makes no round trip into the sandbox; the token it returns is the one envd
// was given when the sandbox was warmed, which nobody could read before:
// Get of a warm sandbox shows no token, Get of the claimed one does.
func TestClaimWithoutEnvHandsWarmToken(t *testing.T) {
	h := newHarness(t, harnessConfig{})
	id := h.warm(1)[0]
	got, err := h.client.Get(t.Context(), connect.NewRequest(&pb.GetRequest{SandboxId: id}))
	if err != nil {
		t.Fatal(err)
	}
	if tok := got.Msg.GetEnvdAccessToken(); tok != "" {
		t.Fatalf("Get of a warm sandbox gave its token %q", tok)
	}
	resp, err := h.client.Claim(t.Context(), claimReq(&pb.ClaimRequest{SandboxId: id}))
	if err != nil {
		t.Fatal(err)
	}
	e := h.rt.Envd(id)
	st := e.State()
	token, inits := st.Token, st.Inits
	if inits != 1 || token == "" || resp.Msg.GetEnvdAccessToken() != token {
		t.Fatalf("claim without env: %d inits (want the warm one only), returned token matches envd's: %v",
			inits, resp.Msg.GetEnvdAccessToken() == token)
	}
	got, err = h.client.Get(t.Context(), connect.NewRequest(&pb.GetRequest{SandboxId: id}))
	if err != nil || got.Msg.GetEnvdAccessToken() != token {
		t.Fatalf("Get of the claimed sandbox: token matches %v, %v", got.Msg.GetEnvdAccessToken() == token, err)
	}
}

// TestClaimByIDConcurrent: ten claims of each of five sandboxes; exactly one
// per sandbox wins, the others get failed_precondition.
func TestClaimByIDConcurrent(t *testing.T) {
	h := newHarness(t, harnessConfig{})
	ids := h.warm(5)
	var (
		mu   sync.Mutex
		wins = map[string]int{}
		lost int
		wg   sync.WaitGroup
	)
	for _, id := range ids {
		for range 10 {
			wg.Go(func() {
				resp, err := h.client.Claim(t.Context(), claimReq(&pb.ClaimRequest{SandboxId: id}))
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					wins[id]++
					if tok := h.rt.Envd(id).Token(); tok != resp.Msg.GetEnvdAccessToken() {
						t.Errorf("envd of %s holds another token than the winner's", id)
					}
				case connect.CodeOf(err) == connect.CodeFailedPrecondition:
					lost++
				default:
					t.Errorf("Claim: %v", err)
				}
			})
		}
	}
	wg.Wait()
	for _, id := range ids {
		if wins[id] != 1 {
			t.Fatalf("sandbox %s claimed %d times", id, wins[id])
		}
	}
	if lost != 45 {
		t.Fatalf("%d claims lost, want 45", lost)
	}
}

func TestClaimInitFailureKills(t *testing.T) {
	h := newHarness(t, harnessConfig{})
	id := h.warm(1)[0]
	e := h.rt.Envd(id)
	e.RejectInit()
	_, err := h.client.Claim(t.Context(), claimReq(&pb.ClaimRequest{SandboxId: id, EnvVars: map[string]string{"A": "1"}}))
	wantCode(t, err, connect.CodeUnavailable)
	if !h.gone(id) || h.rt.Running(id) {
		t.Fatal("a sandbox whose envd refused the claim's token lives on")
	}
	h.assertNothingHeld()
}

// stopFails is the fake runtime whose next stops fail.
type stopFails struct {
	*servicetest.Runtime
	mu    sync.Mutex
	fails int
}

func (r *stopFails) failStops(n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.fails = n
}

func (r *stopFails) Stop(ctx context.Context, id string) error {
	r.mu.Lock()
	fail := r.fails > 0
	if fail {
		r.fails--
	}
	r.mu.Unlock()
	if fail {
		return errors.New("cgroup busy")
	}
	return r.Runtime.Stop(ctx, id)
}

// TestClaimKillFailureEndsAtDeadline: a claimed sandbox whose envd refused
// the new token and whose kill then failed is a team's sandbox nobody can
// use; its deadline is now, as a kill (though the claim asked for
// auto-pause), and the deadline's kill ends it.
func TestClaimKillFailureEndsAtDeadline(t *testing.T) {
	var rt *stopFails
	h := newHarness(t, harnessConfig{wrap: func(r *servicetest.Runtime) sandboxrt.Runtime {
		rt = &stopFails{Runtime: r}
		return rt
	}})
	id := h.warm(1)[0]
	h.rt.Envd(id).RejectInit()
	rt.failStops(1)
	_, err := h.client.Claim(t.Context(), claimReq(&pb.ClaimRequest{SandboxId: id, AutoPause: true, EnvVars: map[string]string{"A": "1"}}))
	wantCode(t, err, connect.CodeUnavailable)
	eventually(t, "the deadline to kill the sandbox whose claim failed", func() bool { return h.gone(id) })
	if h.rt.Running(id) {
		t.Fatal("the sandbox's processes live on")
	}
	h.assertNothingHeld()
}

func TestClaimValidation(t *testing.T) {
	h := newHarness(t, harnessConfig{})
	running := h.create().GetSandbox().GetId()
	for _, tc := range []struct {
		name  string
		req   *pb.ClaimRequest
		code  connect.Code
		field string
	}{
		{"nothing to claim", &pb.ClaimRequest{}, connect.CodeInvalidArgument, "sandbox_id:"},
		{"bad id", &pb.ClaimRequest{SandboxId: "nope"}, connect.CodeInvalidArgument, "sandbox_id:"},
		{"bad pool", &pb.ClaimRequest{Pool: "no-slash"}, connect.CodeInvalidArgument, "pool:"},
		{"no timeout", &pb.ClaimRequest{Pool: testPool, Timeout: durationpb.New(0)}, connect.CodeInvalidArgument, "timeout:"},
		{"bad env", &pb.ClaimRequest{Pool: testPool, EnvVars: map[string]string{"-x": ""}}, connect.CodeInvalidArgument, "env_vars:"},
		{"unknown sandbox", &pb.ClaimRequest{SandboxId: "aaaaaaaaaaaaaaaaaaaa"}, connect.CodeNotFound, ""},
		{"running sandbox", &pb.ClaimRequest{SandboxId: running}, connect.CodeFailedPrecondition, "not warm"},
		{"empty pool", &pb.ClaimRequest{Pool: testPool}, connect.CodeNotFound, ""},
		{"by template", &pb.ClaimRequest{Template: testTemplate}, connect.CodeNotFound, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := h.client.Claim(t.Context(), claimReq(tc.req))
			if tc.field == "" {
				wantCode(t, err, tc.code)
			} else {
				wantCode(t, err, tc.code, tc.field)
			}
		})
	}
	// By template, a warm one is found.
	id := h.warm(1)[0]
	resp, err := h.client.Claim(t.Context(), claimReq(&pb.ClaimRequest{Template: testTemplate}))
	if err != nil || resp.Msg.GetSandbox().GetId() != id {
		t.Fatalf("Claim by template = %v, %v", resp, err)
	}
}

// TestAutoPauseFilesOnlyShown: a created or claimed sandbox says whether its
// deadline's pause keeps the files only, so that the apiserver can end it
// now (a timeout of 0) the same way.
func TestAutoPauseFilesOnlyShown(t *testing.T) {
	h := newHarness(t, harnessConfig{})
	filesOnly := h.create(func(m *pb.CreateRequest) { m.AutoPause, m.AutoPauseFilesOnly = true, true }).GetSandbox()
	memory := h.create(func(m *pb.CreateRequest) { m.AutoPause = true }).GetSandbox()
	if !filesOnly.GetAutoPauseFilesOnly() || memory.GetAutoPauseFilesOnly() {
		t.Fatalf("created: files only %v, with memory %v; want true, false", filesOnly.GetAutoPauseFilesOnly(), memory.GetAutoPauseFilesOnly())
	}
	got, err := h.client.Get(t.Context(), connect.NewRequest(&pb.GetRequest{SandboxId: filesOnly.GetId()}))
	if err != nil || !got.Msg.GetSandbox().GetAutoPauseFilesOnly() {
		t.Fatalf("Get = %v, %v; want auto_pause_files_only", got, err)
	}
	id := h.warm(1)[0]
	claimed, err := h.client.Claim(t.Context(), claimReq(&pb.ClaimRequest{SandboxId: id, AutoPause: true, AutoPauseFilesOnly: true}))
	if err != nil || !claimed.Msg.GetSandbox().GetAutoPauseFilesOnly() {
		t.Fatalf("Claim = %v, %v; want auto_pause_files_only", claimed, err)
	}
}
