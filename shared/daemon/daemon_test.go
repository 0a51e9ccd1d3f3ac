package daemon_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/skiff-dev/skiff/shared/daemon"
)

func listen(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// A request in flight when the signal comes finishes; /readyz turns 503 as
// the drain starts; Wait returns nil once it is done.
func TestGroupDrainsRequestsInFlight(t *testing.T) {
	g := daemon.NewGroup(slog.New(slog.DiscardHandler), 10*time.Second)
	adminLn, ln := listen(t), listen(t)
	g.ServeAdmin(daemon.AdminConfig{}, adminLn)
	entered, release := make(chan struct{}), make(chan struct{})
	g.Serve("the test API", &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		close(entered)
		<-release
		_, _ = w.Write([]byte("done"))
	})}, ln)
	admin := "http://" + adminLn.Addr().String()
	if code, _ := get(t, admin+"/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz before the drain: %d, want 200", code)
	}

	got := make(chan string, 1)
	go func() { _, body := get(t, "http://"+ln.Addr().String()+"/"); got <- body }()
	<-entered
	ctx, stop := context.WithCancel(context.Background())
	waited := make(chan error, 1)
	go func() { waited <- g.Wait(ctx) }()
	stop()
	deadline := time.Now().Add(5 * time.Second)
	for !g.Draining() && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if code, body := get(t, admin+"/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "shutting down") {
		t.Errorf("/readyz during the drain: %d %q, want 503 shutting down", code, body)
	}
	close(release)
	if body := <-got; body != "done" {
		t.Errorf("request in flight got %q, want done", body)
	}
	if err := <-waited; err != nil {
		t.Errorf("Wait: %v", err)
	}
	if _, err := net.DialTimeout("tcp", ln.Addr().String(), time.Second); err == nil {
		t.Error("the listener still accepts after Wait")
	}
}

// A request that outlasts the shutdown timeout sees its context cancelled.
func TestGroupCutsAtTheTimeout(t *testing.T) {
	g := daemon.NewGroup(slog.New(slog.DiscardHandler), 50*time.Millisecond)
	ln := listen(t)
	entered, canceled := make(chan struct{}), make(chan struct{})
	g.Serve("the test API", &http.Server{Handler: http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		close(entered)
		<-r.Context().Done()
		close(canceled)
	})}, ln)
	go func() {
		if resp, err := http.Get("http://" + ln.Addr().String() + "/"); err == nil {
			resp.Body.Close()
		}
	}()
	<-entered
	ctx, stop := context.WithCancel(context.Background())
	stop()
	if err := g.Wait(ctx); err != nil {
		t.Errorf("Wait: %v", err)
	}
	select {
	case <-canceled:
	default:
		t.Error("Wait returned before the request still open was cut")
	}
}

// A server that stops by itself ends Wait with its error, named.
func TestGroupReturnsAServersFailure(t *testing.T) {
	g := daemon.NewGroup(slog.New(slog.DiscardHandler), time.Second)
	ln := listen(t)
	g.Serve("the test API", &http.Server{Handler: http.NotFoundHandler()}, ln)
	_ = ln.Close()
	err := g.Wait(context.Background())
	if err == nil || !strings.Contains(err.Error(), "serve the test API") {
		t.Errorf("Wait: %v, want the test API's failure", err)
	}
}

// A self-serving server (Run) is stopped by the drain, which waits for it;
// one that fails first fails Wait.
func TestGroupRunsSelfServingServers(t *testing.T) {
	g := daemon.NewGroup(slog.New(slog.DiscardHandler), 5*time.Second)
	stopped := make(chan struct{})
	g.Run("the kube API", func(ctx context.Context) error {
		<-ctx.Done()
		time.Sleep(100 * time.Millisecond) // its own shutdown
		close(stopped)
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := g.Wait(ctx); err != nil {
		t.Fatalf("Wait: %v", err)
	}
	select {
	case <-stopped:
	default:
		t.Error("Wait returned before the server had shut down")
	}

	g = daemon.NewGroup(slog.New(slog.DiscardHandler), time.Second)
	g.Run("the kube API", func(context.Context) error { return errors.New("port in use") })
	if err := g.Wait(context.Background()); err == nil || !strings.Contains(err.Error(), "serve the kube API: port in use") {
		t.Errorf("Wait: %v, want the kube API's failure", err)
	}
}

func TestAdminHandler(t *testing.T) {
	notReady := errors.New("the fleet has not synced")
	ln := listen(t)
	srv := daemon.NewAdminServer(daemon.AdminHandler(daemon.AdminConfig{Ready: func() error { return notReady }}), slog.New(slog.DiscardHandler))
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	base := "http://" + ln.Addr().String()
	if code, _ := get(t, base+"/healthz"); code != http.StatusOK {
		t.Errorf("/healthz: %d", code)
	}
	if code, body := get(t, base+"/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, notReady.Error()) {
		t.Errorf("/readyz: %d %q", code, body)
	}
	if code, _ := get(t, base+"/debug/pprof/"); code != http.StatusNotFound {
		t.Errorf("/debug/pprof/ without Pprof: %d, want 404", code)
	}
	if code, _ := get(t, base+"/metrics"); code != http.StatusNotFound {
		t.Errorf("/metrics without a Gatherer: %d, want 404", code)
	}
}

func TestAdminOptionsValidate(t *testing.T) {
	for _, c := range []struct {
		o        daemon.AdminOptions
		optional bool
		want     string
	}{
		{daemon.AdminOptions{Listen: "127.0.0.1:9090"}, false, ""},
		{daemon.AdminOptions{}, true, ""},
		{daemon.AdminOptions{}, false, "--admin-listen is required"},
		{daemon.AdminOptions{EnablePprof: true}, true, "--enable-pprof needs --admin-listen"},
		{daemon.AdminOptions{Listen: "nope"}, true, "want host:port"},
		{daemon.AdminOptions{Listen: ":8080"}, true, "must differ from --listen"},
		{daemon.AdminOptions{Listen: ":0"}, true, ""},
	} {
		err := c.o.Validate(c.optional, map[string]string{"--listen": ":8080", "--other": ":0"})
		if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%+v optional=%v: %v, want %q", c.o, c.optional, err, c.want)
		}
	}
}

func TestReadSecretFile(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	if s, err := daemon.ReadSecretFile("--token-file", write("ok", "  0123456789abcdef\n"), 16); err != nil || s != "0123456789abcdef" {
		t.Errorf("ok: %q %v", s, err)
	}
	if _, err := daemon.ReadSecretFile("--token-file", write("empty", " \n"), 0); err == nil || !strings.Contains(err.Error(), "--token-file") || !strings.Contains(err.Error(), "empty") {
		t.Errorf("empty: %v, want it refused naming the flag", err)
	}
	if _, err := daemon.ReadSecretFile("--token-file", write("short", "abc"), 16); err == nil || !strings.Contains(err.Error(), "at least 16") {
		t.Errorf("short: %v", err)
	}
	if _, err := daemon.ReadSecretFile("--token-file", filepath.Join(dir, "missing"), 1); err == nil || !strings.Contains(err.Error(), "read --token-file") {
		t.Errorf("missing: %v", err)
	}
}
