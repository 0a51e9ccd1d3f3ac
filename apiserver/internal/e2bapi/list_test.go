package e2bapi

import (
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// sdkMetadataQuery encodes a metadata filter the way the JS SDK does:
// encodeURIComponent on each key and value, URLSearchParams around the
// pairs, and the HTTP client's encoding of the whole parameter.
func sdkMetadataQuery(md map[string]string) string {
	pairs := url.Values{}
	for k, v := range md {
		pairs.Set(encodeURIComponent(k), encodeURIComponent(v))
	}
	return url.Values{"metadata": {pairs.Encode()}}.Encode()
}

// encodeURIComponent is JavaScript's: every byte but A-Z a-z 0-9 and
// -_.!~*'() is percent-encoded.
func encodeURIComponent(s string) string {
	var b strings.Builder
	for i := range len(s) {
		c := s[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("-_.!~*'()", c) >= 0 {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}

func TestParseMetadataFilter(t *testing.T) {
	for _, tc := range []struct {
		name  string
		query string // the raw query, as it travels
		want  map[string]string
		bad   bool
	}{
		{"observed SDK capture", "metadata=user%3Da%252520b", map[string]string{"user": "a b"}, false},
		{"plain pairs", "metadata=a%3Db%26c%3Dd", map[string]string{"a": "b", "c": "d"}, false},
		{"once-encoded", "metadata=a=b", map[string]string{"a": "b"}, false},
		{"value with '='", "metadata=k%3Dx%25253Dy", map[string]string{"k": "x=y"}, false},
		{"value with '&'", "metadata=k%3Dx%252526y", map[string]string{"k": "x&y"}, false},
		{"unicode", "metadata=" + url.QueryEscape("name="+url.QueryEscape(encodeURIComponent("é 漢"))), map[string]string{"name": "é 漢"}, false},
		{"no '='", "metadata=abc", nil, true},
		{"two '='", "metadata=a%3Db%3Dc", nil, true},
		{"bad escape", "metadata=%2525YY%3Da", nil, true},
		{"bad value escape", "metadata=a%3D%2525YY", nil, true},
		{"bad outer escape", "metadata=%25YY", nil, true},
		{"trailing '&'", "metadata=a%3Db%26", nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q, err := url.ParseQuery(tc.query)
			if err != nil {
				t.Fatal(err)
			}
			got, err := parseMetadataFilter(q.Get("metadata"))
			if tc.bad {
				if err == nil || !strings.Contains(err.Error(), "metadata") {
					t.Fatalf("parse = %v, %v; want an error naming metadata", got, err)
				}
				return
			}
			if err != nil || !maps.Equal(got, tc.want) {
				t.Fatalf("parse = %v, %v; want %v", got, err, tc.want)
			}
		})
	}
	// The SDK's own encoding round-trips.
	md := map[string]string{"user": "a b", "k=1": "v&2", "%": "+", "ü": "/?#"}
	q, _ := url.ParseQuery(sdkMetadataQuery(md))
	if got, err := parseMetadataFilter(q.Get("metadata")); err != nil || !maps.Equal(got, md) {
		t.Fatalf("SDK round trip = %v, %v", got, err)
	}
}

func TestListFilters(t *testing.T) {
	f, h := newTestServer(t)
	r1 := f.add(teamA, StateRunning, t0, map[string]string{"user": "a b", "app": "x"})
	r2 := f.add(teamA, StateRunning, t0.Add(time.Minute), map[string]string{"user": "c"})
	p1 := f.add(teamA, StatePaused, t0.Add(2*time.Minute), map[string]string{"user": "a b"})
	f.add(teamB, StateRunning, t0, map[string]string{"user": "a b"})
	f.mu.Lock()
	f.sandboxes[r2].sb.TemplateID = "python"
	f.mu.Unlock()

	ids := func(l []wireListed) []string {
		var out []string
		for _, s := range l {
			out = append(out, s.SandboxID)
		}
		return out
	}
	for _, tc := range []struct {
		name, target string
		want         []string
	}{
		{"v2 default: running and paused, newest first", "/v2/sandboxes", []string{p1, r2, r1}},
		{"v1 default: running only", "/sandboxes", []string{r2, r1}},
		{"state running", "/v2/sandboxes?state=running", []string{r2, r1}},
		{"state paused", "/v2/sandboxes?state=paused", []string{p1}},
		{"state CSV", "/v2/sandboxes?state=paused,running", []string{p1, r2, r1}},
		{"state exploded", "/v2/sandboxes?state=paused&state=running", []string{p1, r2, r1}},
		{"v1 honours state", "/sandboxes?state=paused", []string{p1}},
		{"order asc", "/v2/sandboxes?order=asc", []string{r1, r2, p1}},
		{"metadata", "/v2/sandboxes?" + sdkMetadataQuery(map[string]string{"user": "a b"}), []string{p1, r1}},
		{"metadata two keys", "/v2/sandboxes?" + sdkMetadataQuery(map[string]string{"user": "a b", "app": "x"}), []string{r1}},
		{"metadata no match", "/v2/sandboxes?" + sdkMetadataQuery(map[string]string{"user": "zz"}), nil},
		{"metadata v1 observed", "/sandboxes?metadata=user%3Da%252520b", []string{r1}},
		{"empty metadata", "/v2/sandboxes?metadata=", []string{p1, r2, r1}},
		{"startedAfter inclusive", "/v2/sandboxes?startedAfter=" + url.QueryEscape(t0.Add(time.Minute).Format(time.RFC3339)), []string{p1, r2}},
		{"startedAfter JS toISOString", "/v2/sandboxes?startedAfter=2026-03-01T12:01:00.000Z", []string{p1, r2}},
		{"template id", "/v2/sandboxes?template=python", []string{r2}},
		{"template alias", "/v2/sandboxes?template=base-alias", []string{p1, r1}},
		{"limit", "/v2/sandboxes?limit=2", []string{p1, r2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := ids(decodeList(t, do(t, h, http.MethodGet, tc.target, "", keyA)))
			if !slices.Equal(got, tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
		})
	}

	// An empty list is [], not null.
	rec := do(t, h, http.MethodGet, "/v2/sandboxes?state=paused", "", keyB)
	if strings.TrimSpace(rec.Body.String()) != "[]" {
		t.Fatalf("empty list = %s", rec.Body.String())
	}
	// Team B sees only its own.
	if got := decodeList(t, do(t, h, http.MethodGet, "/v2/sandboxes", "", keyB)); len(got) != 1 || got[0].Metadata["user"] != "a b" {
		t.Fatalf("team B sees %v", got)
	}
}

func TestListInvalid(t *testing.T) {
	for _, tc := range []struct{ query, field string }{
		{"state=running,", "state"},
		{"state=killed", "state"},
		{"state=RUNNING", "state"},
		{"order=up", "order"},
		{"startedAfter=yesterday", "startedAfter"},
		{"limit=0", "limit"},
		{"limit=101", "limit"},
		{"limit=-1", "limit"},
		{"limit=ten", "limit"},
		{"nextToken=%21%21", "nextToken"},
		{"nextToken=" + url.QueryEscape("aGVsbG8"), "nextToken"},
		{"metadata=abc", "metadata"},
		{"metadata=%2525ZZ%3D1", "metadata"},
		{"template=base:v2", "tags are not supported here because sandboxes are not tag-scoped"},
	} {
		for _, path := range []string{"/v2/sandboxes", "/sandboxes"} {
			f, h := newTestServer(t)
			wantError(t, do(t, h, http.MethodGet, path+"?"+tc.query, "", keyA), 400, tc.field)
			if f.count("List") != 0 {
				t.Fatalf("%s?%s reached the backend", path, tc.query)
			}
		}
	}
}

// Walking 2,000 sandboxes a page of 100 at a time returns each exactly once,
// in order, even with many sharing a start time, in both orders.
func TestPaginationWalk(t *testing.T) {
	f, h := newTestServer(t)
	for i := range 2000 {
		st := StateRunning
		if i%3 == 0 {
			st = StatePaused
		}
		// Ten sandboxes per start time: the ID breaks the ties.
		f.add(teamA, st, t0.Add(time.Duration(i/10)*time.Second), nil)
	}
	for i := range 50 {
		f.add(teamB, StateRunning, t0.Add(time.Duration(i)*time.Second), nil)
	}
	for _, order := range []string{"desc", "asc"} {
		t.Run(order, func(t *testing.T) {
			var (
				all   []wireListed
				token string
				pages int
			)
			for {
				target := "/v2/sandboxes?limit=100&order=" + order
				if token != "" {
					target += "&nextToken=" + url.QueryEscape(token)
				}
				rec := do(t, h, http.MethodGet, target, "", keyA)
				page := decodeList(t, rec)
				pages++
				all = append(all, page...)
				token = rec.Header().Get(headerNextToken)
				if token == "" {
					break
				}
				if len(page) != 100 {
					t.Fatalf("page %d has %d sandboxes and a next token", pages, len(page))
				}
				if pages > 25 {
					t.Fatal("pagination does not end")
				}
			}
			if pages != 20 || len(all) != 2000 {
				t.Fatalf("%d pages, %d sandboxes; want 20, 2000", pages, len(all))
			}
			seen := map[string]bool{}
			for i, s := range all {
				if seen[s.SandboxID] {
					t.Fatalf("%s returned twice", s.SandboxID)
				}
				seen[s.SandboxID] = true
				if i == 0 {
					continue
				}
				a := listKey{all[i-1].StartedAt, all[i-1].SandboxID}
				b := listKey{s.StartedAt, s.SandboxID}
				if compareKeys(a, b, order == "desc") >= 0 {
					t.Fatalf("out of order at %d: %v then %v", i, a, b)
				}
			}
		})
	}
	// The v2 default page is 100; the deprecated list returns all running.
	rec := do(t, h, http.MethodGet, "/v2/sandboxes", "", keyA)
	if got := decodeList(t, rec); len(got) != 100 || rec.Header().Get(headerNextToken) == "" {
		t.Fatalf("default page: %d sandboxes, token %q", len(got), rec.Header().Get(headerNextToken))
	}
	rec = do(t, h, http.MethodGet, "/sandboxes", "", keyA)
	if got := decodeList(t, rec); len(got) != 1333 || rec.Header().Get(headerNextToken) != "" {
		t.Fatalf("v1 list: %d sandboxes, token %q", len(got), rec.Header().Get(headerNextToken))
	}
}

// A cursor stays valid while sandboxes come and go: nothing before it
// reappears, nothing after it is skipped.
func TestPaginationStableUnderChange(t *testing.T) {
	f, h := newTestServer(t)
	var ids []string
	for i := range 10 {
		ids = append(ids, f.add(teamA, StateRunning, t0.Add(time.Duration(i)*time.Second), nil))
	}
	rec := do(t, h, http.MethodGet, "/v2/sandboxes?limit=4&order=asc", "", keyA)
	first := decodeList(t, rec)
	tok := rec.Header().Get(headerNextToken)
	// The last sandbox of the page dies; a new one starts.
	wantStatus(t, do(t, h, http.MethodDelete, "/sandboxes/"+first[3].SandboxID, "", keyA), http.StatusNoContent)
	newer := f.add(teamA, StateRunning, t0.Add(time.Hour), nil)
	var rest []string
	for tok != "" {
		rec = do(t, h, http.MethodGet, "/v2/sandboxes?limit=4&order=asc&nextToken="+url.QueryEscape(tok), "", keyA)
		for _, s := range decodeList(t, rec) {
			rest = append(rest, s.SandboxID)
		}
		tok = rec.Header().Get(headerNextToken)
	}
	want := append(slices.Clone(ids[4:]), newer)
	if !slices.Equal(rest, want) {
		t.Fatalf("rest = %v, want %v", rest, want)
	}
}

// Sandboxes started within one second page in the order they started: the
// cursor carries the start's fraction (its token has held nanoseconds
// from the first), so a page boundary between two of them neither skips
// nor repeats one, and startedAfter takes a fraction too.
func TestPaginationSubSecondStarts(t *testing.T) {
	f, h := newTestServer(t)
	// Six sandboxes 20 ms apart, their IDs in the reverse order: a tie on
	// the second would list them backwards.
	var ids []string
	for i := range 6 {
		id := strings.Repeat(string(rune('f'-i)), 20)
		f.addWithID(id, teamA, StateRunning, t0.Add(300*time.Millisecond+time.Duration(i)*20*time.Millisecond), nil)
		ids = append(ids, id)
	}
	walk := func(query string, limit int) []string {
		t.Helper()
		var got []string
		token := ""
		for range 10 {
			target := "/v2/sandboxes?limit=" + strconv.Itoa(limit) + "&" + query
			if token != "" {
				target += "&nextToken=" + url.QueryEscape(token)
			}
			rec := do(t, h, http.MethodGet, target, "", keyA)
			for _, s := range decodeList(t, rec) {
				got = append(got, s.SandboxID)
			}
			if token = rec.Header().Get(headerNextToken); token == "" {
				return got
			}
		}
		t.Fatalf("%s by %d: the pages do not end", query, limit)
		return nil
	}
	reversed := slices.Clone(ids)
	slices.Reverse(reversed)
	for _, limit := range []int{1, 2, 4, 100} {
		if got := walk("order=asc", limit); !slices.Equal(got, ids) {
			t.Errorf("asc by %d: %v, want %v", limit, got, ids)
		}
		if got := walk("order=desc", limit); !slices.Equal(got, reversed) {
			t.Errorf("desc by %d: %v, want %v", limit, got, reversed)
		}
	}
	third := url.QueryEscape(t0.Add(340 * time.Millisecond).Format(time.RFC3339Nano))
	if got := walk("order=asc&startedAfter="+third, 2); !slices.Equal(got, ids[2:]) {
		t.Errorf("startedAfter the third's start: %v, want %v", got, ids[2:])
	}
	if got := walk("order=asc&startedAfter="+url.QueryEscape(t0.Format(time.RFC3339)), 100); !slices.Equal(got, ids) {
		t.Errorf("startedAfter their second: %v, want %v", got, ids)
	}
}

func TestCursorRoundTrip(t *testing.T) {
	for _, k := range []listKey{
		{t0, "abc"}, {time.Time{}, "x"}, {time.Unix(0, 1), "y"}, {t0.Add(123456789), strings.Repeat("z", 20)},
	} {
		got, err := decodeCursor(encodeCursor(k))
		if err != nil || !got.startedAt.Equal(k.startedAt) || got.id != k.id {
			t.Fatalf("round trip %v = %v, %v", k, got, err)
		}
	}
	for _, tok := range []string{"", "!!", "YQ", "MS4yLg", "MS4yMDAwMDAwMDAwLmE"} {
		if _, err := decodeCursor(tok); err == nil {
			t.Errorf("decodeCursor(%q) accepted", tok)
		}
	}
}
