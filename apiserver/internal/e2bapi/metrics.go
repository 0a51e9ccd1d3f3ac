package e2bapi

import (
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
)

// metricsConcurrency bounds the backend calls of one GET /sandboxes/metrics.
const metricsConcurrency = 8

func toMetricJSON(m *Metric) metricJSON {
	return metricJSON{
		Timestamp:     m.Timestamp.UTC(),
		TimestampUnix: m.Timestamp.Unix(),
		CPUCount:      m.CPUCount,
		CPUUsedPct:    m.CPUUsedPct,
		MemUsed:       m.MemUsed,
		MemTotal:      m.MemTotal,
		MemCache:      m.MemCache,
		DiskUsed:      m.DiskUsed,
		DiskTotal:     m.DiskTotal,
	}
}

// parseUnix reads an optional non-negative Unix time in seconds.
func parseUnix(q url.Values, name string) (time.Time, error) {
	v := q.Get(name)
	if v == "" {
		return time.Time{}, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 || n > maxUnixSeconds {
		return time.Time{}, Invalid(name, "must be a Unix time in seconds, got %s", echo(v))
	}
	return time.Unix(n, 0), nil
}

// maxUnixSeconds keeps parsed times far from time.Time's overflow.
const maxUnixSeconds = 1 << 40

// metrics serves GET /sandboxes/{id}/metrics: the samples between start
// and end (Unix seconds, both optional), oldest first.
func (s *server) metrics(w http.ResponseWriter, r *http.Request, team, id string) {
	q := r.URL.Query()
	start, err := parseUnix(q, "start")
	if err != nil {
		writeInvalid(w, err)
		return
	}
	end, err := parseUnix(q, "end")
	if err != nil {
		writeInvalid(w, err)
		return
	}
	if !start.IsZero() && !end.IsZero() && end.Before(start) {
		writeInvalid(w, Invalid("end", "is before start"))
		return
	}
	ms, err := s.backend.Metrics(r.Context(), team, id)
	if err = goneIsEmpty(err); err != nil {
		s.writeBackendError(w, r, err, sandboxSubject(id))
		return
	}
	out := make([]metricJSON, 0, len(ms))
	for i := range ms {
		t := ms[i].Timestamp
		// end is a whole second: keep every sample inside it.
		if (!start.IsZero() && t.Before(start)) || (!end.IsZero() && !t.Before(end.Add(time.Second))) {
			continue
		}
		out = append(out, toMetricJSON(&ms[i]))
	}
	writeJSON(w, http.StatusOK, out)
}

// metricsMany serves GET /sandboxes/metrics?sandbox_ids=a,b,c (at most
// 100): the latest sample of each of the team's sandboxes among them.
// Unknown and other teams' IDs are left out, and a malformed one is a 400
// "Invalid sandbox ID", as e2b does.
func (s *server) metricsMany(w http.ResponseWriter, r *http.Request, team string) {
	raw := strings.Join(r.URL.Query()["sandbox_ids"], ",")
	if raw == "" {
		writeInvalid(w, required("sandbox_ids"))
		return
	}
	var ids []string
	seen := map[string]bool{}
	for raw := range strings.SplitSeq(raw, ",") {
		id, ok := shortID(raw)
		if !ok {
			writeError(w, http.StatusBadRequest, "", "Invalid sandbox ID")
			return
		}
		if seen[id] {
			continue
		}
		seen[id] = true
		ids = append(ids, id)
		if len(ids) > maxMetricsSandboxes {
			writeInvalid(w, Invalid("sandbox_ids", "at most %d IDs", maxMetricsSandboxes))
			return
		}
	}
	var (
		mu       sync.Mutex
		out      = map[string]metricJSON{}
		firstErr error
		wg       sync.WaitGroup
		sem      = make(chan struct{}, metricsConcurrency)
	)
	for _, id := range ids {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			ms, err := s.backend.Metrics(r.Context(), team, id)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case errors.Is(err, ErrNotFound):
			case err != nil:
				if firstErr == nil {
					firstErr = err
				}
			case len(ms) > 0:
				out[id] = toMetricJSON(&ms[len(ms)-1])
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		s.writeBackendError(w, r, firstErr, "sandboxes")
		return
	}
	writeJSON(w, http.StatusOK, sandboxesWithMetricsJSON{Sandboxes: out})
}
