package service

import (
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/skiff-dev/skiff/sandboxd/internal/registry"
	"github.com/skiff-dev/skiff/sandboxd/internal/relay"
	"github.com/skiff-dev/skiff/sandboxd/internal/sandboxrt"
	"github.com/skiff-dev/skiff/sandboxd/internal/service/servicetest"
	"github.com/skiff-dev/skiff/shared/routing"
	pb "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
)

// userServer is a server "in" sandbox id, at its address, that answers
// with the traffic token header it got; it returns its port.
func (h *harness) userServer(id string) string {
	h.t.Helper()
	rec, err := h.reg.Get(id)
	if err != nil {
		h.t.Fatal(err)
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(rec.Address, "0"))
	if err != nil {
		h.t.Fatal(err)
	}
	srv := &http.Server{ReadHeaderTimeout: time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello token=%q", r.Header.Get(relay.TrafficTokenHeader))
	})}
	go func() { _ = srv.Serve(ln) }()
	h.t.Cleanup(func() { _ = srv.Close() })
	return strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
}

// relayGet sends GET / for a sandbox's port through the service's
// handler, with trafficToken (when set).
func (h *harness) relayGet(id, port, trafficToken string) (int, string) {
	h.t.Helper()
	status, body, err := h.relayDo(id, port, trafficToken)
	if err != nil {
		h.t.Fatal(err)
	}
	return status, body
}

// relayDo is relayGet for any goroutine.
func (h *harness) relayDo(id, port, trafficToken string) (int, string, error) {
	req, err := http.NewRequestWithContext(h.t.Context(), http.MethodGet, h.url+"/", http.NoBody)
	if err != nil {
		return 0, "", err
	}
	req.Header.Set(routing.HeaderSandboxID, id)
	req.Header.Set(routing.HeaderSandboxPort, port)
	if trafficToken != "" {
		req.Header.Set(relay.TrafficTokenHeader, trafficToken)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

func private(m *pb.CreateRequest) { m.AllowPublicTraffic = new(false) }

func TestPrivateTraffic(t *testing.T) {
	h := newHarness(t, harnessConfig{})
	created := h.create(private, func(m *pb.CreateRequest) { m.AutoResume = true })
	priv, tok := created.GetSandbox(), created.GetTrafficAccessToken()
	if b, err := hex.DecodeString(tok); err != nil || len(b) != 32 || tok == created.GetEnvdAccessToken() {
		t.Fatalf("traffic token %q: want 32 random bytes in hex, not the envd token", tok)
	}
	if priv.GetAllowPublicTraffic() || !priv.GetAutoResume() {
		t.Fatalf("private sandbox = %v", priv)
	}
	pubResp := h.create(func(m *pb.CreateRequest) { m.AllowPublicTraffic = new(true) })
	pub := pubResp.GetSandbox()
	if pubResp.GetTrafficAccessToken() != "" || !pub.GetAllowPublicTraffic() || pub.GetAutoResume() {
		t.Fatalf("public sandbox = %v, token %q", pub, pubResp.GetTrafficAccessToken())
	}
	if other := h.create(private); other.GetTrafficAccessToken() == tok || other.GetTrafficAccessToken() == "" {
		t.Fatal("two private sandboxes share a traffic token")
	}
	got, err := h.client.Get(t.Context(), connect.NewRequest(&pb.GetRequest{SandboxId: priv.GetId()}))
	if err != nil || got.Msg.GetTrafficAccessToken() != tok {
		t.Fatalf("Get = %v, %v; want the traffic token", got, err)
	}
	got, err = h.client.Get(t.Context(), connect.NewRequest(&pb.GetRequest{SandboxId: pub.GetId()}))
	if err != nil || got.Msg.GetTrafficAccessToken() != "" || !got.Msg.GetSandbox().GetAllowPublicTraffic() {
		t.Fatalf("Get of the public one = %v, %v", got, err)
	}

	privPort, pubPort := h.userServer(priv.GetId()), h.userServer(pub.GetId())
	for _, tc := range []struct {
		name, id, port, token string
		status                int
		body                  string
	}{
		{"private, no token", priv.GetId(), privPort, "", 403, `"code":403`},
		{"private, wrong token", priv.GetId(), privPort, tok[:63] + "x", 403, `"code":403`},
		{"private, another sandbox's token", priv.GetId(), privPort, pubResp.GetEnvdAccessToken(), 403, `"code":403`},
		{"private, right token", priv.GetId(), privPort, tok, 200, `hello token=""`},
		{"public, no token", pub.GetId(), pubPort, "", 200, `hello token=""`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, body := h.relayGet(tc.id, tc.port, tc.token)
			if status != tc.status || !strings.Contains(body, tc.body) {
				t.Fatalf("= %d %q, want %d with %q", status, body, tc.status, tc.body)
			}
		})
	}

	// A claim sets them too, and hands a fresh traffic token over.
	warm := h.warm(1)[0]
	claimed, err := h.client.Claim(t.Context(), connect.NewRequest(&pb.ClaimRequest{
		SandboxId: warm, Team: "team-a", Timeout: durationpb.New(time.Minute), AutoResume: true, AllowPublicTraffic: new(false),
	}))
	if err != nil {
		t.Fatal(err)
	}
	ctok := claimed.Msg.GetTrafficAccessToken()
	if len(ctok) != 64 || ctok == tok || claimed.Msg.GetSandbox().GetAllowPublicTraffic() || !claimed.Msg.GetSandbox().GetAutoResume() {
		t.Fatalf("claim = %v", claimed.Msg)
	}
	port := h.userServer(warm)
	if status, _ := h.relayGet(warm, port, ""); status != http.StatusForbidden {
		t.Fatalf("claimed private sandbox without a token: %d", status)
	}
	if status, _ := h.relayGet(warm, port, ctok); status != http.StatusOK {
		t.Fatalf("claimed private sandbox with its token: %d", status)
	}
	if rec, _ := h.reg.Get(warm); rec.Timeout != time.Minute || rec.TrafficAccessToken != ctok || !rec.AutoResume {
		t.Fatalf("claimed record = %+v", rec)
	}
}

// resumeCounter counts the runtime's resumes; while gate is set, a resume
// waits for it to close.
type resumeCounter struct {
	*servicetest.Runtime
	n    atomic.Int32
	gate atomic.Pointer[chan struct{}]
}

func (r *resumeCounter) Resume(ctx context.Context, id string) error {
	r.n.Add(1)
	if g := r.gate.Load(); g != nil {
		<-*g
	}
	return r.Runtime.Resume(ctx, id)
}

// users is how many callers hold or wait for id's lock.
func (k *keyedMutex) users(id string) int {
	k.mu.Lock()
	defer k.mu.Unlock()
	if m, ok := k.locks[id]; ok {
		return m.refs
	}
	return 0
}

// TestAutoResume: a request for a paused sandbox with auto-resume resumes
// it (once, for many concurrent requests) with its deadline at now + its
// last timeout, and Watch reports it running; without auto-resume, 502.
func TestAutoResume(t *testing.T) {
	var counter *resumeCounter
	h := newHarness(t, harnessConfig{wrap: func(r *servicetest.Runtime) sandboxrt.Runtime {
		counter = &resumeCounter{Runtime: r}
		return counter
	}})
	auto := h.create(func(m *pb.CreateRequest) { m.AutoResume = true; m.Timeout = durationpb.New(10 * time.Minute) }).GetSandbox().GetId()
	manual := h.create().GetSandbox().GetId()
	autoPort, manualPort := h.userServer(auto), h.userServer(manual)
	// SetTimeout's timeout is the last one: it is what an auto-resume gives.
	if _, err := h.client.SetTimeout(t.Context(), connect.NewRequest(&pb.SetTimeoutRequest{SandboxId: auto, Timeout: durationpb.New(20 * time.Minute)})); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{auto, manual} {
		if _, err := h.client.Pause(t.Context(), connect.NewRequest(&pb.PauseRequest{SandboxId: id})); err != nil {
			t.Fatal(err)
		}
	}
	h.clock.Step(time.Hour)

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	stream, err := h.client.Watch(ctx, connect.NewRequest(&pb.WatchRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	if !stream.Receive() || stream.Msg().GetSnapshot() == nil {
		t.Fatalf("no snapshot: %v", stream.Err())
	}

	// Without auto-resume: e2b's 502, and it stays paused.
	if status, body := h.relayGet(manual, manualPort, ""); status != http.StatusBadGateway || !strings.Contains(body, "not found") {
		t.Fatalf("paused without auto-resume: %d %q", status, body)
	}
	if rec, _ := h.reg.Get(manual); rec.State != registry.StatePaused || counter.n.Load() != 0 {
		t.Fatalf("paused without auto-resume: state %s, %d resumes", rec.State, counter.n.Load())
	}

	// With it: 20 requests at once, one resume, every request answered.
	// The first resume is held until all 20 wait on the sandbox's lock.
	gate := make(chan struct{})
	counter.gate.Store(&gate)
	var wg sync.WaitGroup
	statuses := make(chan int, 20)
	for range 20 {
		wg.Go(func() {
			status, _, err := h.relayDo(auto, autoPort, "")
			if err != nil {
				t.Error(err)
			}
			statuses <- status
		})
	}
	eventually(t, "20 requests to wait for one resume", func() bool { return h.svc.locks.users(auto) == 20 })
	close(gate)
	wg.Wait()
	close(statuses)
	for s := range statuses {
		if s != http.StatusOK {
			t.Fatalf("a request for the auto-resumed sandbox: %d", s)
		}
	}
	if n := counter.n.Load(); n != 1 {
		t.Fatalf("%d resumes for concurrent requests, want 1", n)
	}
	want := h.clock.Now().Add(20 * time.Minute)
	rec, _ := h.reg.Get(auto)
	if rec.State != registry.StateRunning || !rec.EndAt.Equal(want) || !rec.PausedAt.IsZero() {
		t.Fatalf("after auto-resume: state %s, end %v (want %v), pausedAt %v", rec.State, rec.EndAt, want, rec.PausedAt)
	}
	if at, ok := h.svc.deadlines.Deadline(auto); !ok || !at.Equal(want) {
		t.Fatalf("deadline = %v %v, want %v", at, ok, want)
	}
	if st, _ := h.rt.Status(t.Context(), auto); st != sandboxrt.Running {
		t.Fatalf("runtime status %s", st)
	}
	if !stream.Receive() {
		t.Fatalf("stream ended: %v", stream.Err())
	}
	if ch := stream.Msg().GetChange(); ch.GetSandbox().GetId() != auto || ch.GetSandbox().GetState() != pb.SandboxState_SANDBOX_STATE_RUNNING ||
		!ch.GetSandbox().GetEndAt().AsTime().Equal(want) {
		t.Fatalf("watch change = %v, want %s running until %v", ch, auto, want)
	}

	// Auto-paused at its deadline, then woken: a whole last timeout again.
	ap := h.create(func(m *pb.CreateRequest) {
		m.AutoPause, m.AutoResume, m.Timeout = true, true, durationpb.New(3*time.Minute)
	}).GetSandbox().GetId()
	apPort := h.userServer(ap)
	h.clock.Step(3 * time.Minute)
	eventually(t, "the deadline to pause", func() bool {
		r, err := h.reg.Get(ap)
		return err == nil && r.State == registry.StatePaused
	})
	h.clock.Step(time.Minute)
	if status, _ := h.relayGet(ap, apPort, ""); status != http.StatusOK {
		t.Fatalf("auto-paused sandbox woken: %d", status)
	}
	if r, _ := h.reg.Get(ap); r.State != registry.StateRunning || !r.EndAt.Equal(h.clock.Now().Add(3*time.Minute)) {
		t.Fatalf("after waking the auto-paused sandbox: %s until %v", r.State, r.EndAt)
	}
}

// TestRecoverKeepsTrafficAndAutoResume: a restarted sandboxd keeps a
// sandbox's traffic token, auto-resume and last timeout, and acts on them.
func TestRecoverKeepsTrafficAndAutoResume(t *testing.T) {
	dir := t.TempDir()
	n := servicetest.NewNetwork()
	rt := servicetest.NewRuntime(t, n)
	a := newHarness(t, harnessConfig{dir: dir, net: n, rt: rt})
	created := a.create(private, func(m *pb.CreateRequest) { m.AutoResume = true; m.Timeout = durationpb.New(7 * time.Minute) })
	id, tok := created.GetSandbox().GetId(), created.GetTrafficAccessToken()
	if _, err := a.client.Pause(t.Context(), connect.NewRequest(&pb.PauseRequest{SandboxId: id})); err != nil {
		t.Fatal(err)
	}
	a.stop()

	b := newHarness(t, harnessConfig{dir: dir, net: n, rt: rt, clock: a.clock})
	got, err := b.client.Get(t.Context(), connect.NewRequest(&pb.GetRequest{SandboxId: id}))
	if err != nil || got.Msg.GetTrafficAccessToken() != tok || !got.Msg.GetSandbox().GetAutoResume() || got.Msg.GetSandbox().GetAllowPublicTraffic() {
		t.Fatalf("re-adopted = %v, %v", got, err)
	}
	port := b.userServer(id)
	if status, _ := b.relayGet(id, port, ""); status != http.StatusForbidden {
		t.Fatalf("re-adopted private sandbox without a token: %d", status)
	}
	if status, _ := b.relayGet(id, port, tok); status != http.StatusOK {
		t.Fatalf("re-adopted private sandbox with its token: %d", status)
	}
	if r, _ := b.reg.Get(id); r.State != registry.StateRunning || !r.EndAt.Equal(b.clock.Now().Add(7*time.Minute)) {
		t.Fatalf("re-adopted sandbox after auto-resume: %s until %v", r.State, r.EndAt)
	}
}

// The relay learns a sandbox's network namespace from the network, and
// through it reaches a server the sandbox binds to its loopback.
func TestResolveNamesTheNamespace(t *testing.T) {
	h := newHarness(t, harnessConfig{})
	id := h.create().GetSandbox().GetId()
	sb, err := h.svc.Resolve(t.Context(), id)
	if err != nil || sb.NetNS != h.net.NSPath(id) || sb.NetNS == "" {
		t.Fatalf("Resolve = %+v, %v; want NetNS %q", sb, err, h.net.NSPath(id))
	}
}

// A sandbox paused with its files only is booted by an explicit resume
// alone, as in e2b: the relay is told it does not auto-resume, so a
// request without its token gets the 502 of a sandbox traffic cannot
// wake, not the 403 of one the right token would.
func TestPausedFilesOnlyDoesNotAutoResume(t *testing.T) {
	h, _ := newSnapshotHarness(t)
	id := h.create(func(m *pb.CreateRequest) { m.AutoPause, m.AutoResume = true, true }).GetSandbox().GetId()
	h.pause(id, false)
	if sb, err := h.svc.Resolve(t.Context(), id); err != nil || !sb.Paused || !sb.AutoResume {
		t.Fatalf("paused with its memory: %+v, %v; want it to auto-resume", sb, err)
	}
	if _, err := h.client.Resume(t.Context(), connect.NewRequest(&pb.ResumeRequest{SandboxId: id})); err != nil {
		t.Fatal(err)
	}
	h.pause(id, true)
	if sb, err := h.svc.Resolve(t.Context(), id); err != nil || !sb.Paused || sb.AutoResume {
		t.Fatalf("paused with its files only: %+v, %v; want it not to auto-resume", sb, err)
	}
}
