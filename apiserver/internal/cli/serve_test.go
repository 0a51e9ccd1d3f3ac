package cli

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	pb "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
)

// parseServe parses serve's flags from args onto the defaults and
// completes them, as serve does. The aggregated API is off (--secure-port
// 0) unless args turn it on: the tests that want it say so, and the rest
// must not all bind its default port.
func parseServe(t testing.TB, args ...string) *serveOptions {
	t.Helper()
	o := newServeOptions()
	fs := pflag.NewFlagSet("serve", pflag.ContinueOnError)
	o.AddFlags(fs)
	if err := fs.Parse(append([]string{"--secure-port=0"}, args...)); err != nil {
		t.Fatalf("parse %v: %v", args, err)
	}
	if err := o.Complete(); err != nil {
		t.Fatalf("complete %v: %v", args, err)
	}
	return o
}

func TestServeOptionsValidate(t *testing.T) {
	static := []string{"--sandboxd", "127.0.0.1:27777", "--sandboxd-token-file", "/t", "--api-keys-file", "/k"}
	kube := []string{"--inventory", "kube", "--sandboxd-token-file", "/t"}
	with := func(base []string, more ...string) []string { return append(append([]string{}, base...), more...) }
	for _, tc := range []struct {
		name string
		args []string
		// want are substrings of the error, each naming a flag; none: valid.
		want []string
	}{
		{"static", static, nil},
		{"static is the default", with(static, "--inventory", "static"), nil},
		{"kube", kube, nil},
		{"kube with a kubeconfig and limits", with(kube, "--kubeconfig", "/kc", "--inventory-stale-after", "2m", "--cache-sync-timeout", "10s", "--create-rate-per-team", "1"), nil},
		{"unknown inventory", with(static, "--inventory", "etcd"), []string{`--inventory "etcd"`}},
		{"static without hosts", []string{"--sandboxd-token-file", "/t", "--api-keys-file", "/k"}, []string{"--sandboxd"}},
		{"static without keys file", []string{"--sandboxd", "h:1", "--sandboxd-token-file", "/t"}, []string{"--api-keys-file"}},
		{"static with a kubeconfig", with(static, "--kubeconfig", "/kc"), []string{"--kubeconfig"}},
		{"kube with hosts", with(kube, "--sandboxd", "h:1"), []string{"--sandboxd is only read with --inventory static"}},
		{"kube with a keys file", with(kube, "--api-keys-file", "/k"), []string{"--api-keys-file is only read with --inventory static", "skiff.dev/api-key"}},
		{"kube with no stale window", with(kube, "--inventory-stale-after", "0s"), []string{"--inventory-stale-after"}},
		{"kube with no sync timeout", with(kube, "--cache-sync-timeout", "0s"), []string{"--cache-sync-timeout"}},
		{"no token", []string{"--inventory", "kube"}, []string{"--sandboxd-token-file", "--node-token-key-file"}},
		{"static without a token", []string{"--sandboxd", "h:1", "--api-keys-file", "/k"}, []string{"--sandboxd-token-file is required"}},
		{"kube with a token per host", []string{"--inventory", "kube", "--node-token-key-file", "/key"}, nil},
		{"kube with a token and a key", with(kube, "--node-token-key-file", "/key"), []string{"--sandboxd-token-file and --node-token-key-file exclude each other"}},
		{"static with a key", []string{"--sandboxd", "h:1", "--api-keys-file", "/k", "--node-token-key-file", "/key"},
			[]string{"--node-token-key-file is only read with --inventory kube"}},
		{"no listen", with(static, "--listen", ""), []string{"--listen"}},
		{"bad listen", with(static, "--listen", "8080"), []string{`--listen "8080": want host:port`}},
		{"admin off", with(static, "--admin-listen", ""), nil},
		{"admin on all interfaces, with pprof", with(static, "--admin-listen", ":9090", "--enable-pprof"), nil},
		{"bad admin listen", with(static, "--admin-listen", "localhost"), []string{`--admin-listen "localhost": want host:port`}},
		{"admin listen is listen", with(static, "--listen", ":8080", "--admin-listen", ":8080"), []string{"--admin-listen \":8080\": must differ from --listen"}},
		{"pprof without admin", with(static, "--admin-listen", "", "--enable-pprof"), []string{"--enable-pprof needs --admin-listen"}},
		{"no max timeout", with(static, "--max-timeout", "0s"), []string{"--max-timeout"}},
		{"no read timeout", with(static, "--read-timeout", "0s"), []string{"--read-timeout"}},
		{"negative rate", with(static, "--create-rate-per-team", "-1"), []string{"--create-rate-per-team"}},
		{"rate without burst", with(static, "--create-rate-per-team", "1", "--create-burst-per-team", "0"), []string{"--create-burst-per-team"}},
		{"negative team limit", with(static, "--max-sandboxes-per-team", "-1"), []string{"--max-sandboxes-per-team"}},
		{"bad placement", with(kube, "--placement-sample-size", "0"), []string{"--placement-sample-size"}},
		{"kube with the aggregated API", with(kube, "--secure-port", "8443", "--watch-history", "10", "--watch-bookmark-interval", "5s"), nil},
		{"static with the aggregated API", with(static, "--secure-port", "8443"), []string{"--secure-port serves the aggregated API, which needs --inventory kube"}},
		{"no watch history", with(kube, "--secure-port", "8443", "--watch-history", "0"), []string{"--watch-history"}},
		{"no bookmark interval", with(kube, "--secure-port", "8443", "--watch-bookmark-interval", "0s"), []string{"--watch-bookmark-interval"}},
		{"bad secure port", with(kube, "--secure-port", "70000"), []string{"--secure-port"}},
		{"static with warm pools", with(static, "--warm-pool", "base=2,py=1"), nil},
		{"a bad warm pool", with(static, "--warm-pool", "base"), []string{"--warm-pool \"base\": want template=replicas"}},
		{"kube with --warm-pool", with(kube, "--warm-pool", "base=2"), []string{"--warm-pool is only read with --inventory static"}},
		{"kube without a lease", with(kube, "--leader-elect=false"), nil},
		{"a lease that cannot renew", with(kube, "--leader-elect-lease-duration", "5s", "--leader-elect-renew-deadline", "10s"), []string{"--leader-elect-lease-duration"}},
		{"no warm-pool interval", with(static, "--warm-pool-interval", "0s"), []string{"--warm-pool-interval"}},
		{"debug logs as JSON", with(static, "--log-level", "debug", "--log-format", "json"), nil},
		{"unknown log level", with(static, "--log-level", "loud"), []string{"--log-level"}},
		{"unknown log format", with(static, "--log-format", "xml"), []string{"--log-format"}},
		{"every problem at once", []string{"--inventory", "kube", "--sandboxd", "h:1", "--api-keys-file", "/k", "--max-timeout", "0s"},
			[]string{"--sandboxd is only", "--api-keys-file is only", "--sandboxd-token-file", "--max-timeout"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := parseServe(t, tc.args...).Validate()
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("Validate = %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate = nil, want an error naming %v", tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Validate = %q, want it to mention %q", err, w)
				}
			}
		})
	}
}

// serve refuses invalid options before it listens or reads anything.
func TestServeValidatesFirst(t *testing.T) {
	_, err := run(t, "serve", "--inventory", "kube", "--api-keys-file", "/no/such/file", "--listen", "127.0.0.1:0")
	if err == nil || !strings.Contains(err.Error(), "--api-keys-file is only read with --inventory static") {
		t.Fatalf("serve = %v", err)
	}
}

// The operations endpoints are on by default, on loopback, without
// profiles.
func TestServeOperationsDefaults(t *testing.T) {
	o := parseServe(t)
	if o.admin.Listen != "127.0.0.1:9090" || o.admin.EnablePprof {
		t.Errorf("--admin-listen %q, --enable-pprof %v; want 127.0.0.1:9090 and false", o.admin.Listen, o.admin.EnablePprof)
	}
}

// Teams are limited by default, as on e2b (its Pro plan: 100 concurrent
// sandboxes, 5 creates a second), and each limit can be turned off.
func TestServeLimitsTeamsByDefault(t *testing.T) {
	o := parseServe(t)
	if o.createRate != 5 || o.createBurst != 20 || o.maxPerTeam != 100 {
		t.Errorf("--create-rate-per-team %g, --create-burst-per-team %d, --max-sandboxes-per-team %d; want 5, 20 and 100",
			o.createRate, o.createBurst, o.maxPerTeam)
	}
	if o := parseServe(t, "--create-rate-per-team", "0", "--max-sandboxes-per-team", "0"); o.createRate != 0 || o.maxPerTeam != 0 {
		t.Errorf("limits off: rate %g, max %d", o.createRate, o.maxPerTeam)
	}

	// A team with 100 sandboxes gets 429 for the next, with no flag set.
	host := newStandin(t, "host-a")
	for range 100 {
		host.sandboxes = append(host.sandboxes, &pb.Sandbox{Id: host.sandboxID(t), Template: "base", State: pb.SandboxState_SANDBOX_STATE_RUNNING, Team: "team-a"})
	}
	host.release()
	o, key := staticOptions(t, []string{host.endpoint()})
	s := startServing(t, o)
	waitFor(t, "/readyz answers 200", func() bool { code, _ := get(t, s.admin+"/readyz"); return code == http.StatusOK })
	a := api{t: t, base: s.api}
	code, body := a.call(key, http.MethodPost, "/v2/sandboxes", `{"templateID":"base"}`)
	if code != http.StatusTooManyRequests || !strings.Contains(string(body), "100 sandboxes") {
		t.Errorf("the 101st sandbox of a team = %d %s, want 429 naming the limit of 100", code, body)
	}
}

// A fork counts against the team's limits as creates do, through the
// served API: a fork of n needs room for n sandboxes and n tokens of the
// create rate, or is refused whole with 429; the tokens a fork takes are
// gone for creates.
func TestServeLimitsForks(t *testing.T) {
	host := newStandin(t, "host-a")
	src, other := host.sandboxID(t), host.sandboxID(t)
	host.sandboxes = []*pb.Sandbox{
		{Id: src, Template: "base", State: pb.SandboxState_SANDBOX_STATE_RUNNING, Team: "team-a"},
		{Id: other, Template: "base", State: pb.SandboxState_SANDBOX_STATE_PAUSED, Team: "team-a"},
	}
	host.release()
	serve := func(args ...string) (api, string) {
		o, key := staticOptions(t, []string{host.endpoint()}, args...)
		s := startServing(t, o)
		waitFor(t, "/readyz answers 200", func() bool { code, _ := get(t, s.admin+"/readyz"); return code == http.StatusOK })
		return api{t: t, base: s.api}, key
	}
	fork := func(a api, key string, count, want int, says string) {
		t.Helper()
		code, body := a.call(key, http.MethodPost, "/sandboxes/"+src+"/fork", fmt.Sprintf(`{"count":%d}`, count))
		if code != want || !strings.Contains(string(body), says) {
			t.Errorf("a fork of %d = %d %s, want %d with %s", count, code, body, want, says)
		}
	}

	// The rate alone: a fork of more than the burst takes a full burst.
	a, key := serve("--max-sandboxes-per-team", "0", "--create-rate-per-team", "0.0001", "--create-burst-per-team", "3")
	fork(a, key, 1, http.StatusCreated, `"sandboxID"`)
	fork(a, key, 4, http.StatusTooManyRequests, `{"code":429,"message":"too many sandboxes created: a fork of 4, more than the team's create burst of 3, waits for the team's full burst"}`)

	a, key = serve("--max-sandboxes-per-team", "6", "--create-rate-per-team", "0.0001", "--create-burst-per-team", "3")
	// 2 + 5 > 6, refused before the rate is asked.
	fork(a, key, 5, http.StatusTooManyRequests,
		`{"code":429,"message":"rate limited: the team has 2 sandboxes (creates and forks in flight counted), and a fork of 5 would pass its limit of 6"}`)
	fork(a, key, 2, http.StatusCreated, `"sandboxID"`)
	// 4 + 2 fit, but 1 token is left: a fork of 2 is refused whole.
	fork(a, key, 2, http.StatusTooManyRequests, `{"code":429,"message":"too many sandboxes created: the team's create rate is exhausted, retry later"}`)
	// The fork of 2 spent 2 of the 3 tokens, the refused one none: a
	// create takes the last, and the next is refused.
	if code, body := a.call(key, http.MethodPost, "/v2/sandboxes", `{"templateID":"base"}`); code == http.StatusTooManyRequests {
		t.Errorf("a create with one token left = %d %s", code, body)
	}
	if code, body := a.call(key, http.MethodPost, "/v2/sandboxes", `{"templateID":"base"}`); code != http.StatusTooManyRequests ||
		!strings.Contains(string(body), "create rate is exhausted") {
		t.Errorf("a create once the fork and a create spent the burst = %d %s, want 429", code, body)
	}
	if n := host.forked.Load(); n != 3 {
		t.Errorf("the host started %d forks, want only the 1 and the 2 of the forks that fit", n)
	}
}
