package relay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/skiff-dev/skiff/envd/filesig"
	"github.com/skiff-dev/skiff/shared/routing"
)

// echoServer answers every request with the traffic token header it got
// (or "none") and counts requests.
type echoServer struct {
	hits atomic.Int32
}

func (e *echoServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	e.hits.Add(1)
	got := "none"
	if v, ok := r.Header[TrafficTokenHeader]; ok {
		got = strings.Join(v, ",")
	}
	fmt.Fprintf(w, "token=%s", got)
}

// serveAt serves h on ip:port (port 0: any) until the test ends.
func serveAt(t *testing.T, ip string, port int, h http.Handler) string {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(port)))
	if err != nil {
		t.Fatalf("listen on %s:%d: %v", ip, port, err)
	}
	srv := &http.Server{Handler: h}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	_, p, _ := net.SplitHostPort(ln.Addr().String())
	return p
}

// loopbackIP is an address of 127/8 of its own (Linux answers on all of
// it), so a test can listen on envd's fixed port without colliding.
func loopbackIP() string {
	return fmt.Sprintf("127.%d.%d.%d", 100+rand.IntN(100), rand.IntN(256), 1+rand.IntN(254))
}

type relayAnswer struct {
	status int
	body   string
}

func send(t *testing.T, relayURL, id, port string, headers map[string]string) relayAnswer {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, relayURL+"/x", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set(routing.HeaderSandboxID, id)
	req.Header.Set(routing.HeaderSandboxPort, port)
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return relayAnswer{resp.StatusCode, string(body)}
}

// wantE2bError checks e2b's {"code","message"} shape.
func wantE2bError(t *testing.T, got relayAnswer, status int, contains string) {
	t.Helper()
	var e struct {
		SandboxID string `json:"sandboxId"`
		Code      int    `json:"code"`
		Message   string `json:"message"`
	}
	if got.status != status || json.Unmarshal([]byte(got.body), &e) != nil || e.Code != status || !strings.Contains(e.Message, contains) ||
		(status == http.StatusForbidden && e.SandboxID == "") {
		t.Fatalf("= %d %q, want %d {code,message} with %q", got.status, got.body, status, contains)
	}
}

// A private sandbox's user ports need the traffic token: missing or wrong
// 403 with e2b's messages (neither reaches the sandbox), right passes with the header
// stripped. envd's port is not affected, and a public sandbox needs none.
func TestTrafficToken(t *testing.T) {
	const token = "0123456789abcdef0123456789abcdef"
	ip := loopbackIP()
	user, envd := &echoServer{}, &echoServer{}
	userPort := serveAt(t, ip, 0, user)
	serveAt(t, ip, routing.EnvdPort, envd)
	relay, res := startRelay(t)
	const private, public = "sbx00000000000000prv", "sbx00000000000000pub"
	res.set(private, Sandbox{Address: ip, TrafficAccessToken: token})
	res.set(public, Sandbox{Address: ip})
	envdPort := strconv.Itoa(routing.EnvdPort)

	for _, tc := range []struct {
		name     string
		id, port string
		headers  map[string]string
		status   int
		body     string // the sandbox's answer, or a word of the error
	}{
		{"private, no token", private, userPort, nil, 403, "Sandbox is secured with traffic access token. Token header 'e2b-traffic-access-token' is missing"},
		{"private, empty token", private, userPort, map[string]string{TrafficTokenHeader: ""}, 403, "Token header 'e2b-traffic-access-token' is missing"},
		{"private, wrong token", private, userPort, map[string]string{TrafficTokenHeader: "0123456789abcdef0123456789abcdeX"}, 403, "Sandbox is secured with traffic access token. Provided token in header 'e2b-traffic-access-token' is invalid"},
		{"private, shorter token", private, userPort, map[string]string{TrafficTokenHeader: token[:8]}, 403, "is invalid"},
		{"private, lower-case header", private, userPort, map[string]string{"e2b-traffic-access-token": token}, 200, "token=none"},
		{"private, right token", private, userPort, map[string]string{TrafficTokenHeader: token}, 200, "token=none"},
		{"private, envd without token", private, envdPort, nil, 200, "token=none"},
		{"private, envd strips a token too", private, envdPort, map[string]string{TrafficTokenHeader: token}, 200, "token=none"},
		{"public, no token", public, userPort, nil, 200, "token=none"},
		{"public, a token is stripped", public, userPort, map[string]string{TrafficTokenHeader: "anything"}, 200, "token=none"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := user.hits.Load() + envd.hits.Load()
			got := send(t, relay.URL, tc.id, tc.port, tc.headers)
			if tc.status != http.StatusOK {
				wantE2bError(t, got, tc.status, tc.body)
				if user.hits.Load()+envd.hits.Load() != before {
					t.Fatal("a refused request reached the sandbox")
				}
				return
			}
			if got.status != tc.status || got.body != tc.body {
				t.Fatalf("= %d %q, want %d %q", got.status, got.body, tc.status, tc.body)
			}
		})
	}
}

// resumer is a resolver that can resume: it marks the sandbox running and
// counts resumes; err, when set, is what a resume fails with.
type resumer struct {
	*resolver
	resumes atomic.Int32
	err     error
}

func (r *resumer) AutoResume(_ context.Context, id string) (Sandbox, error) {
	r.resumes.Add(1)
	if r.err != nil {
		return Sandbox{}, r.err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	sb, ok := r.sandboxes[id]
	if !ok {
		return Sandbox{}, fmt.Errorf("%w: %s", ErrUnknownSandbox, id)
	}
	sb.Paused = false
	r.sandboxes[id] = sb
	return sb, nil
}

func TestAutoResume(t *testing.T) {
	const token = "tok-tok-tok-tok"
	ip := loopbackIP()
	user := &echoServer{}
	port := serveAt(t, ip, 0, user)
	const id = "sbx000000000000pause"

	for _, tc := range []struct {
		name        string
		sb          Sandbox
		canResume   bool
		resumeErr   error
		headers     map[string]string
		status      int
		body        string
		wantResumes int32
	}{
		{"auto-resume", Sandbox{Address: ip, Paused: true, AutoResume: true}, true, nil, nil, 200, "token=none", 1},
		{"no auto-resume", Sandbox{Address: ip, Paused: true}, true, nil, nil, 502, "The sandbox was not found", 0},
		{"resolver cannot resume", Sandbox{Address: ip, Paused: true, AutoResume: true}, false, nil, nil, 502, "The sandbox was not found", 0},
		{"private, no token: not woken", Sandbox{Address: ip, Paused: true, AutoResume: true, TrafficAccessToken: token}, true, nil, nil, 403, "is missing", 0},
		{"private, wrong token: not woken", Sandbox{Address: ip, Paused: true, AutoResume: true, TrafficAccessToken: token}, true, nil, map[string]string{TrafficTokenHeader: "nope"}, 403, "is invalid", 0},
		{"private, right token", Sandbox{Address: ip, Paused: true, AutoResume: true, TrafficAccessToken: token}, true, nil, map[string]string{TrafficTokenHeader: token}, 200, "token=none", 1},
		{"gone meanwhile", Sandbox{Address: ip, Paused: true, AutoResume: true}, true, fmt.Errorf("%w: %s", ErrUnknownSandbox, id), nil, 502, "The sandbox was not found", 1},
		{"resume fails", Sandbox{Address: ip, Paused: true, AutoResume: true}, true, errors.New("freezer stuck"), nil, 502, "could not be resumed", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := newResolver()
			res.set(id, tc.sb)
			rs := &resumer{resolver: res, err: tc.resumeErr}
			h := New(res)
			if tc.canResume {
				h = New(rs)
			}
			srv := httptest.NewServer(h)
			defer srv.Close()
			before := user.hits.Load()
			got := send(t, srv.URL, id, port, tc.headers)
			if tc.status == http.StatusOK {
				if got.status != 200 || got.body != tc.body {
					t.Fatalf("= %d %q, want 200 %q", got.status, got.body, tc.body)
				}
				if res.get(id).Paused {
					t.Fatal("forwarded, but the sandbox is still paused")
				}
			} else {
				wantE2bError(t, got, tc.status, tc.body)
				if user.hits.Load() != before {
					t.Fatal("a refused request reached the sandbox")
				}
			}
			if n := rs.resumes.Load(); n != tc.wantResumes {
				t.Fatalf("%d resumes, want %d", n, tc.wantResumes)
			}
		})
	}
}

// A paused sandbox wakes for a request to envd's port only if envd would
// take it: with the sandbox's access token, whatever the path (a /health
// with it wakes it, as on e2b: the SDK's isRunning), or a /files URL
// signed with it. A request without it (a /health probe, a CORS
// preflight, a made-up token) used to resume the sandbox, with a full new
// timeout, before envd refused it; it gets e2b's 403.
func TestAutoResumeOfEnvdNeedsItsToken(t *testing.T) {
	const token = "k3x9q2m7v1p8z0c4t7fa.secret-secret-secret"
	ip := loopbackIP()
	envd := &echoServer{}
	serveAt(t, ip, routing.EnvdPort, envd)
	const id = "sbx00000000000asleep"
	exp := time.Now().Add(time.Hour).Unix()
	signed := "/files?" + url.Values{
		"path": {"/home/user/a"}, "signature": {filesig.Sign("/home/user/a", filesig.OpRead, "", token, nil)},
	}.Encode()
	signedExp := "/files?" + url.Values{
		"path": {"/home/user/a"}, "username": {"user"}, "signature_expiration": {strconv.FormatInt(exp, 10)},
		"signature": {filesig.Sign("/home/user/a", filesig.OpWrite, "user", token, &exp)},
	}.Encode()
	for _, tc := range []struct {
		name, method, path string
		headers            map[string]string
		wake               bool
	}{
		{"the access token", http.MethodPost, "/process.Process/Start", map[string]string{"X-Access-Token": token}, true},
		{"no token", http.MethodPost, "/process.Process/Start", nil, false},
		{"a wrong token", http.MethodPost, "/process.Process/Start", map[string]string{"X-Access-Token": token + "x"}, false},
		{"a health check", http.MethodGet, "/health", map[string]string{"X-Access-Token": token}, true},
		{"a health check without the token", http.MethodGet, "/health", nil, false},
		{"a CORS preflight", http.MethodOptions, "/files", nil, false},
		{"an OPTIONS with the token", http.MethodOptions, "/files", map[string]string{"X-Access-Token": token}, true},
		{"a signed download", http.MethodGet, signed, nil, true},
		{"a signed upload with an expiry", http.MethodPost, signedExp, nil, true},
		{"a download signed for upload", http.MethodGet, signedExp, nil, false},
		{"a signature elsewhere", http.MethodGet, "/envs?" + strings.SplitN(signed, "?", 2)[1], nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := newResolver()
			res.set(id, Sandbox{Address: ip, Paused: true, AutoResume: true, EnvdAccessToken: token})
			rs := &resumer{resolver: res}
			srv := httptest.NewServer(New(rs))
			defer srv.Close()
			req, err := http.NewRequestWithContext(t.Context(), tc.method, srv.URL+tc.path, nil)
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set(routing.HeaderSandboxID, id)
			req.Header.Set(routing.HeaderSandboxPort, strconv.Itoa(routing.EnvdPort))
			for k, v := range tc.headers {
				req.Header.Set(k, v)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if woke := rs.resumes.Load() == 1; woke != tc.wake {
				t.Fatalf("woken %v, want %v (answer %d %q)", woke, tc.wake, resp.StatusCode, body)
			}
			if !tc.wake {
				wantE2bError(t, relayAnswer{resp.StatusCode, string(body)}, http.StatusForbidden, "This sandbox can't be resumed with the credentials provided.")
			}
		})
	}
	// A sandbox without a token to check wakes for anything but a health
	// check or a CORS preflight, which anyone could send to keep it awake.
	for _, tc := range []struct {
		method, path string
		wake         bool
	}{{http.MethodGet, "/health", false}, {http.MethodOptions, "/files", false}, {http.MethodGet, "/envs", true}} {
		res := newResolver()
		res.set(id, Sandbox{Address: ip, Paused: true, AutoResume: true})
		rs := &resumer{resolver: res}
		srv := httptest.NewServer(New(rs))
		req, _ := http.NewRequestWithContext(t.Context(), tc.method, srv.URL+tc.path, nil)
		req.Header.Set(routing.HeaderSandboxID, id)
		req.Header.Set(routing.HeaderSandboxPort, strconv.Itoa(routing.EnvdPort))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		srv.Close()
		if woke := rs.resumes.Load() == 1; woke != tc.wake {
			t.Fatalf("%s %s of a sandbox without a token: woken %v, want %v (answer %d %q)", tc.method, tc.path, woke, tc.wake, resp.StatusCode, body)
		}
		if !tc.wake {
			wantE2bError(t, relayAnswer{resp.StatusCode, string(body)}, http.StatusBadGateway, "The sandbox was not found")
		}
	}
}
