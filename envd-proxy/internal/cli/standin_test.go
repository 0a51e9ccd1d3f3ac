package cli

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	pb "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
	"github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1/sandboxdv1connect"
	"github.com/skiff-dev/skiff/shared/sandboxid"
)

// testToken is the node token of the tests' sandboxd stand-ins.
const testToken = "node-token-for-tests-0123456789"

// standin stands in for one host's sandboxd: its Connect API answers Info
// and Watch (what static mode follows), and a request naming a sandbox is
// "relayed": answered with the node's name, after a check of the node
// token (testToken unless newStandinWithToken). It counts accepted
// connections and relayed requests, and keeps the last relayed request's
// headers, token or not.
type standin struct {
	sandboxdv1connect.UnimplementedSandboxdServiceHandler
	node    string
	token   string
	srv     *httptest.Server
	accepts atomic.Int64
	relayed atomic.Int64

	mu        sync.Mutex
	sandboxes []string
	lastRelay http.Header
	stopWatch chan struct{} // closed: Watch streams end
}

func newStandin(t *testing.T, node string) *standin {
	t.Helper()
	return newStandinWithToken(t, node, testToken)
}

// newStandinWithToken is newStandin for a host that accepts token.
func newStandinWithToken(t *testing.T, node, token string) *standin {
	t.Helper()
	s := &standin{node: node, token: token, stopWatch: make(chan struct{})}
	mux := http.NewServeMux()
	mux.Handle(sandboxdv1connect.NewSandboxdServiceHandler(s))
	s.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("E2b-Sandbox-Id") == "" {
			if r.Header.Get("Authorization") != "Bearer "+s.token {
				http.Error(w, "bad token", http.StatusUnauthorized)
				return
			}
			mux.ServeHTTP(w, r)
			return
		}
		s.relayed.Add(1)
		s.mu.Lock()
		s.lastRelay = r.Header.Clone()
		s.mu.Unlock()
		if r.Header.Get("Skiff-Node-Token") != s.token {
			http.Error(w, "bad node token", http.StatusUnauthorized)
			return
		}
		_, _ = io.WriteString(w, "relayed by "+node+" to "+r.Header.Get("E2b-Sandbox-Id")+":"+r.Header.Get("E2b-Sandbox-Port"))
	}))
	s.srv.Listener = &countingListener{Listener: s.srv.Listener, n: &s.accepts}
	s.srv.Start()
	t.Cleanup(s.srv.Close)
	return s
}

func (s *standin) endpoint() string { return s.srv.Listener.Addr().String() }

// lastHeader is a header of the last relayed request.
func (s *standin) lastHeader(name string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lastRelay.Get(name)
}

// newSandbox adds a sandbox to the host and returns its ID.
func (s *standin) newSandbox(t *testing.T) string {
	t.Helper()
	id, err := sandboxid.New(sandboxid.NodeTag(s.node))
	if err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	s.sandboxes = append(s.sandboxes, id)
	s.mu.Unlock()
	return id
}

// stopWatching ends the Watch streams, as a host that goes away does.
func (s *standin) stopWatching() {
	s.mu.Lock()
	defer s.mu.Unlock()
	close(s.stopWatch)
}

func (s *standin) Info(context.Context, *connect.Request[pb.InfoRequest]) (*connect.Response[pb.InfoResponse], error) {
	s.mu.Lock()
	stopped := isClosed(s.stopWatch)
	s.mu.Unlock()
	if stopped {
		return nil, connect.NewError(connect.CodeUnavailable, nil)
	}
	return connect.NewResponse(&pb.InfoResponse{
		NodeName: s.node, Tag: string(sandboxid.NodeTag(s.node)), MaxSandboxes: 10,
		Capacity: &pb.Resources{CpuMilli: 1000, MemoryMib: 1024},
	}), nil
}

func (s *standin) Watch(ctx context.Context, _ *connect.Request[pb.WatchRequest], stream *connect.ServerStream[pb.WatchResponse]) error {
	s.mu.Lock()
	snap := &pb.WatchResponse_Snapshot{}
	for _, id := range s.sandboxes {
		snap.Sandboxes = append(snap.Sandboxes, &pb.Sandbox{Id: id, Template: "base", State: pb.SandboxState_SANDBOX_STATE_RUNNING})
	}
	stop := s.stopWatch
	s.mu.Unlock()
	if err := stream.Send(&pb.WatchResponse{Event: &pb.WatchResponse_Snapshot_{Snapshot: snap}}); err != nil {
		return err
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-stop:
		return connect.NewError(connect.CodeUnavailable, nil)
	}
}

func isClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

type countingListener struct {
	net.Listener
	n *atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

// proxyRun is `serve` running on loopback listeners.
type proxyRun struct {
	url, admin string
	stop       context.CancelFunc
	done       chan error
}

// startProxy runs the proxy with o (listen addresses are ignored) and
// returns once /readyz answers 200. Without a --node-token-key-file, its
// --sandboxd-token-file holds testToken.
func startProxy(t *testing.T, o Options) *proxyRun {
	t.Helper()
	if o.NodeTokens.KeyFile == "" {
		tokenFile := filepath.Join(t.TempDir(), "token")
		if err := os.WriteFile(tokenFile, []byte(testToken+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		o.NodeTokens.TokenFile = tokenFile
	}
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	adminLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &proxyRun{url: "http://" + ln.Addr().String(), admin: "http://" + adminLn.Addr().String(), stop: cancel, done: make(chan error, 1)}
	go func() { p.done <- run(ctx, &o, ln, adminLn, testLogger(t)) }()
	t.Cleanup(func() {
		cancel()
		if err := <-p.done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	waitFor(t, "/readyz answers 200", func() bool {
		select {
		case err := <-p.done:
			t.Fatalf("serve ended before it was ready: %v", err)
		default:
		}
		code, _ := httpGet(t, p.admin+"/readyz", nil)
		return code == http.StatusOK
	})
	return p
}

// send asks the proxy for sandbox id's port 49983.
func (p *proxyRun) send(t *testing.T, id string) (int, string) {
	t.Helper()
	return httpGet(t, p.url+"/files?path=%2Fa", map[string]string{"E2b-Sandbox-Id": id, "E2b-Sandbox-Port": "49983"})
}

var testClient = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}

func httpGet(t *testing.T, url string, headers map[string]string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(b))
}

// waitFor polls cond; the guard only turns a hang into a failure.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within a minute", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
