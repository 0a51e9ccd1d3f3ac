package hostbench

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"
)

// Result is one measured value, a JSON line of the benchmark's output.
type Result struct {
	// Bench is density, lifecycle or floor.
	Bench string `json:"bench"`
	// Metric names what was measured, Unit its unit.
	Metric string  `json:"metric"`
	Value  float64 `json:"value"`
	Unit   string  `json:"unit"`
	// At is where it was taken: the sandboxes running (density) or the
	// concurrency (lifecycle, floor).
	At int `json:"at"`
	// Note says more, e.g. what refused the first sandbox past the target.
	Note string `json:"note,omitempty"`
}

// Recorder writes results as JSON lines and keeps them for the summary.
type Recorder struct {
	mu  sync.Mutex
	out io.Writer
	all []Result
}

// NewRecorder writes to out (nil: keep only).
func NewRecorder(out io.Writer) *Recorder { return &Recorder{out: out} }

// Add records r.
func (rec *Recorder) Add(r Result) {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	rec.all = append(rec.all, r)
	if rec.out != nil {
		b, _ := json.Marshal(r)
		_, _ = fmt.Fprintf(rec.out, "%s\n", b)
	}
}

// Results are every result so far.
func (rec *Recorder) Results() []Result {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return slices.Clone(rec.all)
}

// ReadResults reads JSON lines written by a Recorder.
func ReadResults(r io.Reader) ([]Result, error) {
	var out []Result
	dec := json.NewDecoder(r)
	for dec.More() {
		var res Result
		if err := dec.Decode(&res); err != nil {
			return nil, err
		}
		out = append(out, res)
	}
	return out, nil
}

// percentile is the p-th percentile (0..1) of d, in milliseconds.
func percentile(d []time.Duration, p float64) float64 {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return float64(s[min(len(s)-1, int(float64(len(s))*p))].Microseconds()) / 1000
}

const mib = 1 << 20

// Summary is results as a table, a line each.
func Summary(rs []Result) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%-10s %-28s %6s %12s  %s\n", "bench", "metric", "at", "value", "unit")
	for _, r := range rs {
		note := ""
		if r.Note != "" {
			note = "  (" + r.Note + ")"
		}
		fmt.Fprintf(&b, "%-10s %-28s %6d %12.2f  %s%s\n", r.Bench, r.Metric, r.At, r.Value, r.Unit, note)
	}
	return b.String()
}
