package e2bapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"
)

func TestUnsupportedRoutes(t *testing.T) {
	f, h := newTestServer(t)
	id := f.add(teamA, StateRunning, t0, nil)
	wild := regexp.MustCompile(`\{[a-zA-Z]+\}`)
	for _, u := range unsupportedRoutes {
		method, path, _ := strings.Cut(u.Pattern, " ")
		path = wild.ReplaceAllStringFunc(path, func(w string) string {
			if w == "{id}" {
				return id
			}
			return "x1"
		})
		rec := do(t, h, method, path, "{}", keyA)
		wantError(t, rec, http.StatusNotImplemented, "not supported by Skiff yet", u.Pattern)
	}
	if n := f.hostCalls(); n != 0 {
		t.Fatalf("501 routes made %d backend calls", n)
	}
}

// docs/e2b-compat.md lists every route this package serves or refuses.
func TestCompatDocListsEveryRoute(t *testing.T) {
	b, err := os.ReadFile("../../../docs/e2b-compat.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	patterns := []string{
		"GET /health", "POST /sandboxes", "POST /v2/sandboxes", "GET /sandboxes", "GET /v2/sandboxes",
		"GET /sandboxes/metrics", "GET /sandboxes/{sandboxID}", "DELETE /sandboxes/{sandboxID}",
		"POST /sandboxes/{sandboxID}/connect", "POST /v2/sandboxes/{sandboxID}/connect",
		"POST /sandboxes/{sandboxID}/timeout", "POST /sandboxes/{sandboxID}/refreshes",
		"POST /sandboxes/{sandboxID}/pause", "POST /sandboxes/{sandboxID}/resume",
		"GET /sandboxes/{sandboxID}/metrics", "GET /sandboxes/{sandboxID}/logs", "GET /v2/sandboxes/{sandboxID}/logs",
		"GET /templates", "GET /v2/templates", "GET /templates/{templateID}", "GET /templates/aliases/{alias}",
	}
	for _, u := range unsupportedRoutes {
		patterns = append(patterns, strings.ReplaceAll(u.Pattern, "{id}", "{sandboxID}"))
	}
	for _, p := range patterns {
		method, path, _ := strings.Cut(p, " ")
		if !strings.Contains(doc, fmt.Sprintf("| `%s` | `%s` |", method, path)) {
			t.Errorf("docs/e2b-compat.md has no row for %s", p)
		}
	}
}

func TestNoRouteAndWrongMethod(t *testing.T) {
	_, h := newTestServer(t)
	wantError(t, do(t, h, http.MethodGet, "/nope", "", keyA), 404, "no route")
	wantError(t, do(t, h, http.MethodGet, "/sandboxes/", "", keyA), 404)
	rec := do(t, h, http.MethodPut, "/sandboxes", "", keyA)
	wantError(t, rec, 405, "PUT")
	if allow := rec.Header().Get("Allow"); !strings.Contains(allow, "POST") || !strings.Contains(allow, "GET") {
		t.Fatalf("Allow = %q", allow)
	}
	wantError(t, do(t, h, http.MethodGet, "/templates/base/whatever", "", keyA), 404, "no route")
	wantError(t, do(t, h, http.MethodGet, "/sandboxes/../health", "", ""), 404, "no route")
	wantError(t, do(t, h, http.MethodGet, "//sandboxes", "", keyA), 404, "no route")
}

func TestHealth(t *testing.T) {
	_, h := newTestServer(t)
	rec := do(t, h, http.MethodGet, "/health", "", "")
	wantStatus(t, rec, http.StatusOK)
	if rec.Body.String() != "Health check successful" {
		t.Fatalf("body %q", rec.Body.String())
	}
	sick := New(Config{Backend: sickBackend{newFakeBackend()}, Team: testTeam, Logger: discard})
	wantError(t, do(t, sick, http.MethodGet, "/health", "", ""), 503)
}

type sickBackend struct{ *fakeBackend }

func (sickBackend) Healthy(context.Context) error { return errors.New("no inventory") }

func TestMetrics(t *testing.T) {
	f, h := newTestServer(t)
	id := f.add(teamA, StateRunning, t0, nil)
	other := f.add(teamB, StateRunning, t0, nil)
	quiet := f.add(teamA, StateRunning, t0, nil)
	for i := range 5 {
		m := Metric{Timestamp: t0.Add(time.Duration(i) * 10 * time.Second), CPUCount: 2, CPUUsedPct: float64(i), MemUsed: int64(i), MemTotal: 512 << 20, DiskTotal: 1 << 30}
		f.metrics[id] = append(f.metrics[id], m)
		f.metrics[other] = append(f.metrics[other], m)
	}
	rec := do(t, h, http.MethodGet, "/sandboxes/"+id+"/metrics", "", keyA)
	wantStatus(t, rec, http.StatusOK)
	var raw []map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &raw); err != nil || len(raw) != 5 {
		t.Fatalf("metrics = %s (%v)", rec.Body.String(), err)
	}
	for _, m := range raw {
		checkKeys(t, "SandboxMetric", m, metricRequired, nil)
	}
	var ms []metricJSON
	strictDecode(t, rec.Body.Bytes(), &ms)
	if ms[4].TimestampUnix != t0.Add(40*time.Second).Unix() || ms[4].CPUUsedPct != 4 {
		t.Fatalf("last metric = %+v", ms[4])
	}
	// start and end (Unix seconds, inclusive) narrow the window.
	q := fmt.Sprintf("?start=%d&end=%d", t0.Add(10*time.Second).Unix(), t0.Add(30*time.Second).Unix())
	strictDecode(t, do(t, h, http.MethodGet, "/sandboxes/"+id+"/metrics"+q, "", keyA).Body.Bytes(), &ms)
	if len(ms) != 3 {
		t.Fatalf("windowed metrics: %d", len(ms))
	}
	if rec := do(t, h, http.MethodGet, "/sandboxes/"+quiet+"/metrics", "", keyA); strings.TrimSpace(rec.Body.String()) != "[]" {
		t.Fatalf("no samples = %s", rec.Body.String())
	}
	for _, q := range []string{"start=-1", "start=abc", "end=1.5", "start=20&end=10"} {
		wantError(t, do(t, h, http.MethodGet, "/sandboxes/"+id+"/metrics?"+q, "", keyA), 400)
	}

	// Many: the latest of each of the team's own sandboxes.
	rec = do(t, h, http.MethodGet, "/sandboxes/metrics?sandbox_ids="+id+","+other+","+quiet+","+id+"-6532622b,"+id, "", keyA)
	wantStatus(t, rec, http.StatusOK)
	checkKeys(t, "SandboxesWithMetrics", keysOf(t, rec.Body.Bytes()), []string{"sandboxes"}, nil)
	var many sandboxesWithMetricsJSON
	strictDecode(t, rec.Body.Bytes(), &many)
	if len(many.Sandboxes) != 1 || many.Sandboxes[id].CPUUsedPct != 4 {
		t.Fatalf("many = %+v", many)
	}
	wantError(t, do(t, h, http.MethodGet, "/sandboxes/metrics", "", keyA), 400, "sandbox_ids")
	wantError(t, do(t, h, http.MethodGet, "/sandboxes/metrics?sandbox_ids="+id+",bad", "", keyA), 400, "Invalid sandbox ID")
	ids := make([]string, 101)
	for i := range ids {
		ids[i] = fmt.Sprintf("%020d", i)
	}
	wantError(t, do(t, h, http.MethodGet, "/sandboxes/metrics?sandbox_ids="+strings.Join(ids, ","), "", keyA), 400, "sandbox_ids")
}

func TestLogs(t *testing.T) {
	f, h := newTestServer(t)
	id := f.add(teamA, StateRunning, t0, nil)
	for i, l := range []struct{ level, line, source string }{
		{"", "envd started", "envd"}, {"info", "hello", "stdout"}, {"error", "oops", "stderr"},
		{"debug", "noise", "envd"}, {"warn", "careful hello", "stdout"},
	} {
		f.logs[id] = append(f.logs[id], LogEntry{Timestamp: t0.Add(time.Duration(i) * time.Second), Level: l.level, Line: l.line, Source: l.source})
	}
	ms := func(d time.Duration) string { return fmt.Sprint(t0.Add(d).UnixMilli()) }

	rec := do(t, h, http.MethodGet, "/sandboxes/"+id+"/logs?start="+ms(time.Second)+"&limit=2", "", keyA)
	wantStatus(t, rec, http.StatusOK)
	checkKeys(t, "SandboxLogs", keysOf(t, rec.Body.Bytes()), []string{"logs", "logEntries"}, nil)
	var v1 sandboxLogsJSON
	strictDecode(t, rec.Body.Bytes(), &v1)
	// A v1 line is the whole record, as JSON, as e2b's: the e2b CLI parses
	// it, and needs its level.
	if len(v1.Logs) != 2 || v1.Logs[0].Line != `{"level":"info","logger":"stdout","message":"hello"}` || v1.LogEntries[0].Message != "hello" ||
		v1.LogEntries[1].Level != "error" || v1.LogEntries[1].Fields["source"] != "stderr" {
		t.Fatalf("v1 logs = %+v", v1)
	}

	v2 := func(q string) []string {
		t.Helper()
		rec := do(t, h, http.MethodGet, "/v2/sandboxes/"+id+"/logs?"+q, "", keyA)
		wantStatus(t, rec, http.StatusOK)
		var raw struct {
			Logs []map[string]any `json:"logs"`
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &raw); err != nil {
			t.Fatal(err)
		}
		for _, e := range raw.Logs {
			checkKeys(t, "SandboxLogEntry", e, logEntryRequired, nil)
		}
		var out sandboxLogsV2JSON
		strictDecode(t, rec.Body.Bytes(), &out)
		var lines []string
		for _, e := range out.Logs {
			lines = append(lines, e.Message)
		}
		return lines
	}
	for _, tc := range []struct{ q, want string }{
		{"", "careful hello,noise,oops,hello,envd started"}, // e2b's default: backward
		{"direction=forward", "envd started,hello,oops,noise,careful hello"},
		{"direction=forward&level=info", "envd started,hello,oops,careful hello"},
		{"level=warn", "careful hello,oops"},
		{"direction=forward&search=hello", "hello,careful hello"},
		{"direction=forward&cursor=" + ms(2*time.Second), "oops,noise,careful hello"},
		{"direction=forward&cursor=" + ms(2*time.Second) + "&limit=1", "oops"},
		{"cursor=" + ms(2*time.Second), "oops,hello,envd started"},
		{"direction=backward&cursor=" + ms(2*time.Second) + "&limit=2", "oops,hello"},
		{"limit=0", ""},
	} {
		if got := strings.Join(v2(tc.q), ","); got != tc.want {
			t.Errorf("v2 logs ?%s = %q, want %q", tc.q, got, tc.want)
		}
	}
	for _, tc := range []struct{ q, field string }{
		{"limit=1001", "limit"}, {"limit=-1", "limit"}, {"direction=sideways", "direction"},
		{"level=fatal", "level"}, {"search=" + strings.Repeat("s", 257), "search"}, {"cursor=x", "cursor"},
	} {
		wantError(t, do(t, h, http.MethodGet, "/v2/sandboxes/"+id+"/logs?"+tc.q, "", keyA), 400, tc.field)
	}
	wantError(t, do(t, h, http.MethodGet, "/sandboxes/"+id+"/logs?start=-4", "", keyA), 400, "start")

	// What the host is asked: the window's oldest lines from v1's start
	// and v2's forward cursor, its newest up to v2's backward cursor, with
	// v2's filters, so that a page beyond the host's newest lines is read
	// where it is.
	f.logQueries = nil
	do(t, h, http.MethodGet, "/sandboxes/"+id+"/logs?start="+ms(time.Second)+"&limit=2", "", keyA)
	do(t, h, http.MethodGet, "/v2/sandboxes/"+id+"/logs?direction=forward&cursor="+ms(2*time.Second)+"&limit=3&level=warn&search=x", "", keyA)
	do(t, h, http.MethodGet, "/v2/sandboxes/"+id+"/logs?direction=backward&cursor="+ms(2*time.Second), "", keyA)
	do(t, h, http.MethodGet, "/v2/sandboxes/"+id+"/logs?level=debug", "", keyA)
	want := []LogQuery{
		{Start: t0.Add(time.Second), Limit: 2, Forward: true},
		{Start: t0.Add(2 * time.Second), Limit: 3, Forward: true, MinLevel: "warn", Search: "x"},
		{End: t0.Add(2 * time.Second), Limit: defaultLogLimit},
		{Limit: defaultLogLimit},
	}
	if len(f.logQueries) != len(want) {
		t.Fatalf("queries %+v, want %+v", f.logQueries, want)
	}
	for i, q := range f.logQueries {
		if !q.Start.Equal(want[i].Start) || !q.End.Equal(want[i].End) || q.Limit != want[i].Limit || q.Forward != want[i].Forward ||
			q.MinLevel != want[i].MinLevel || q.Search != want[i].Search {
			t.Errorf("query %d = %+v, want %+v", i, q, want[i])
		}
	}
}

func TestTemplates(t *testing.T) {
	f, h := newTestServer(t)
	for i := range 3 {
		f.templates = append(f.templates, Template{ID: fmt.Sprintf("t%d", i), Version: "1", CPUMilli: 1000, MemoryMB: 256, EnvdVersion: "0.6.13", CreatedAt: t0})
	}
	rec := do(t, h, http.MethodGet, "/templates", "", keyA)
	wantStatus(t, rec, http.StatusOK)
	var raw []map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &raw); err != nil || len(raw) != 5 {
		t.Fatalf("templates = %s", rec.Body.String())
	}
	for _, m := range raw {
		checkKeys(t, "Template", m, templateRequired, nil)
	}
	var ts []templateJSON
	strictDecode(t, rec.Body.Bytes(), &ts)
	base := ts[0]
	if base.TemplateID != "base" || base.CPUCount != 2 || base.MemoryMB != 512 || !base.Public || base.BuildStatus != "ready" ||
		strings.Join(base.Names, ",") != "base,base-alias" || !regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-8[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`).MatchString(base.BuildID) ||
		!base.UpdatedAt.Equal(base.CreatedAt) {
		t.Fatalf("base = %+v", base)
	}
	if ts[1].Aliases == nil {
		t.Fatal("aliases must be [] not null")
	}

	// v2 pages by ID.
	var got []string
	tok := ""
	for range 5 {
		target := "/v2/templates?limit=2"
		if tok != "" {
			target += "&nextToken=" + tok
		}
		rec := do(t, h, http.MethodGet, target, "", keyA)
		strictDecode(t, rec.Body.Bytes(), &ts)
		for _, x := range ts {
			got = append(got, x.TemplateID)
		}
		if tok = rec.Header().Get(headerNextToken); tok == "" {
			break
		}
	}
	if strings.Join(got, ",") != "base,python,t0,t1,t2" {
		t.Fatalf("v2 walk = %v", got)
	}
	wantError(t, do(t, h, http.MethodGet, "/v2/templates?limit=0", "", keyA), 400, "limit")
	wantError(t, do(t, h, http.MethodGet, "/v2/templates?nextToken=%21", "", keyA), 400, "nextToken")

	for _, name := range []string{"base", "base-alias"} {
		rec := do(t, h, http.MethodGet, "/templates/"+name, "", keyA)
		wantStatus(t, rec, http.StatusOK)
		m := keysOf(t, rec.Body.Bytes())
		checkKeys(t, "TemplateWithBuilds", m, withBuildsReq, nil)
		for _, b := range m["builds"].([]any) {
			checkKeys(t, "TemplateBuild", b.(map[string]any), buildRequired, buildOptional)
		}
		var wb templateWithBuildsJSON
		strictDecode(t, rec.Body.Bytes(), &wb)
		if wb.TemplateID != "base" || len(wb.Builds) != 1 || wb.Builds[0].BuildID != base.BuildID {
			t.Fatalf("with builds = %+v", wb)
		}

		rec = do(t, h, http.MethodGet, "/templates/aliases/"+name, "", keyA)
		wantStatus(t, rec, http.StatusOK)
		checkKeys(t, "TemplateAliasResponse", keysOf(t, rec.Body.Bytes()), aliasRespRequired, nil)
	}
	wantError(t, do(t, h, http.MethodGet, "/templates/nope", "", keyA), 404, "nope")
	wantError(t, do(t, h, http.MethodGet, "/templates/aliases/nope", "", keyA), 404, "nope")
	wantError(t, do(t, h, http.MethodGet, "/templates/base/tags", "", keyA), 501, "tags")
}
