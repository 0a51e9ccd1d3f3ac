package fleet_test

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/skiff-dev/skiff/apiserver/internal/e2bapi"
	"github.com/skiff-dev/skiff/apiserver/internal/fleet"
)

// listed is what the order tests read of a listed sandbox.
type listed struct {
	SandboxID string    `json:"sandboxID"`
	StartedAt time.Time `json:"startedAt"`
}

// listPages lists team1's sandboxes through the e2b API over h's Backend,
// in order, limit to a page (the next token carried between pages), and
// calls between after the first page.
func listPages(t *testing.T, h *harness, order string, limit int, between func()) []listed {
	t.Helper()
	srv := e2bapi.New(e2bapi.Config{
		Backend: h.b,
		Team:    func(*http.Request) (string, bool) { return "team1", true },
		Logger:  slog.New(slog.DiscardHandler),
	})
	var all []listed
	token := ""
	for pages := 1; ; pages++ {
		target := "/v2/sandboxes?order=" + order + "&limit=" + strconv.Itoa(limit)
		if token != "" {
			target += "&nextToken=" + url.QueryEscape(token)
		}
		rec := httptest.NewRecorder()
		srv.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, target, nil))
		if rec.Code != http.StatusOK {
			t.Fatalf("GET %s: %d %s", target, rec.Code, rec.Body)
		}
		var page []listed
		if err := json.Unmarshal(rec.Body.Bytes(), &page); err != nil {
			t.Fatal(err)
		}
		all = append(all, page...)
		if token = rec.Header().Get("X-Next-Token"); token == "" {
			return all
		}
		if pages == 1 && between != nil {
			between()
		}
		if pages > 20 {
			t.Fatal("the pages do not end")
		}
	}
}

// Sandboxes started in the same second list in the order they started,
// ascending and descending, in one page or several: their starts keep
// sandboxd's microseconds, both while this replica's own writes list them
// and once the inventory does, and when the inventory takes over between
// two pages. (e2b's SDK suite creates two sandboxes about 20 ms apart and
// expects Sandbox.list({order}) in creation order: in whole seconds they
// tied, and their random IDs broke the tie.)
func TestListOrderFollowsSubSecondStarts(t *testing.T) {
	for _, tc := range []struct {
		name string
		// direct: the inventory is applied as is (make up's static
		// source), not through JSON. published: the inventory lists the
		// sandboxes before the listing; takeover: between its pages.
		direct, published, takeover bool
	}{
		{name: "this replica's writes"},
		{name: "inventory through JSON", published: true},
		{name: "static inventory", direct: true, published: true},
		{name: "inventory takes over between pages", takeover: true},
		{name: "static inventory takes over between pages", direct: true, takeover: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, order := range []string{"asc", "desc"} {
				for _, limit := range []int{100, 1, 2, 5} {
					t.Run(order+" by "+strconv.Itoa(limit), func(t *testing.T) {
						testListOrder(t, tc.direct, tc.published, tc.takeover, order, limit)
					})
				}
			}
		})
	}
}

func testListOrder(t *testing.T, direct, published, takeover bool, order string, limit int) {
	a := newFakeNode("node-a", "base")
	h := newHarness(t, a)
	h.direct = direct
	// Six sandboxes 20 ms apart within one second, each start with
	// nanoseconds past its microsecond (sandboxd's clock): random IDs put
	// them in start order by chance once in 720.
	const n = 6
	var want []listed
	for i := range n {
		frac := 300*time.Millisecond + time.Duration(i)*20*time.Millisecond
		a.frac = frac + 789 // nanoseconds
		sb, err := h.b.Create(t.Context(), "team1", params("base"))
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, listed{SandboxID: sb.ID, StartedAt: t0.Add(frac)})
	}
	if order == "desc" {
		slices.Reverse(want)
	}
	takeOver := func() {
		h.publish(a)
		h.advance(fleet.DefaultRecentTTL) // the inventory alone now
	}
	if published {
		takeOver()
	}
	var between func()
	if takeover {
		between = takeOver
	}
	got := listPages(t, h, order, limit, between)
	if !slices.EqualFunc(got, want, func(g, w listed) bool { return g.SandboxID == w.SandboxID && g.StartedAt.Equal(w.StartedAt) }) {
		t.Fatalf("listed %s by %d:\n got %v\nwant %v", order, limit, got, want)
	}
}
