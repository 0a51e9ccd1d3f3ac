package fleetbench

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// Phases of a run.
const (
	PhaseSetup  = "setup"
	PhaseSteady = "steady"
	PhaseChurn  = "churn"
	PhaseDeath  = "death"
)

// Result is one measurement: one line of the JSON-lines output.
type Result struct {
	// Time is when the run started; the run's lines share it.
	Time             time.Time `json:"time"`
	Hosts            int       `json:"hosts"`
	SandboxesPerHost int       `json:"sandboxesPerHost"`
	Sandboxes        int       `json:"sandboxes"`
	Teams            int       `json:"teams"`
	IntervalSeconds  float64   `json:"intervalSeconds"`
	WindowSeconds    float64   `json:"windowSeconds"`
	// Churn is the churn phase's rate, as a fraction of all sandboxes per
	// second.
	Churn float64 `json:"churn"`
	// Shards is how many NodeInventoryShards each host's sandboxes were
	// in; 0: none (also in results from before the shards).
	Shards int `json:"shards"`
	// ShardFormat is how the shards held their sandboxes (packed or
	// structured); empty in results from before spec.packed (structured).
	ShardFormat string `json:"shardFormat,omitempty"`
	// MaxChanges is how many changed sandboxes a host's inventory carried
	// before a fold; 0: none (also in results from before
	// spec.sandboxChanges).
	MaxChanges int `json:"maxChanges,omitempty"`
	// Phase is setup, steady, churn or death.
	Phase string `json:"phase"`
	// Metric names the measurement; Component the process or reader it is
	// of, if any.
	Metric    string  `json:"metric"`
	Component string  `json:"component,omitempty"`
	Value     float64 `json:"value"`
	Unit      string  `json:"unit"`
}

// Report is a run's results.
type Report struct {
	Results []Result
	// LogDir is where every component's log is.
	LogDir string
	head   Result   // the fields every result shares
	notes  []string // what failed, in words
}

func (r *Report) add(phase, metric, component string, value float64, unit string) {
	res := r.head
	res.Phase, res.Metric, res.Component, res.Value, res.Unit = phase, metric, component, value, unit
	r.Results = append(r.Results, res)
}

// Get returns the value of one result, and whether there is one.
func (r *Report) Get(phase, metric, component string) (float64, bool) {
	for _, res := range r.Results {
		if res.Phase == phase && res.Metric == metric && res.Component == component {
			return res.Value, true
		}
	}
	return 0, false
}

// AppendJSON appends the results to path, one JSON object a line.
func (r *Report) AppendJSON(path string) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("open --out %s: %w", path, err)
	}
	enc := json.NewEncoder(f)
	for _, res := range r.Results {
		if err := enc.Encode(res); err != nil {
			_ = f.Close()
			return fmt.Errorf("write --out %s: %w", path, err)
		}
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write --out %s: %w", path, err)
	}
	return nil
}

// Print writes the results as a table: one row per metric and component,
// a column per phase.
func (r *Report) Print(w io.Writer) {
	h := r.head
	fmt.Fprintf(w, "\nfleetsim: %d hosts × %d sandboxes = %d sandboxes, %d teams; publish interval %gs, stale window %gs, churn %g/s\n",
		h.Hosts, h.SandboxesPerHost, h.Sandboxes, h.Teams, h.IntervalSeconds, h.WindowSeconds, h.Churn)
	type key struct{ metric, component, unit string }
	var rows []key
	cells := map[key]map[string]float64{}
	for _, res := range r.Results {
		k := key{res.Metric, res.Component, res.Unit}
		if cells[k] == nil {
			cells[k] = map[string]float64{}
			rows = append(rows, k)
		}
		cells[k][res.Phase] = res.Value
	}
	phases := []string{PhaseSetup, PhaseSteady, PhaseChurn, PhaseDeath}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "metric\tcomponent\t"+strings.Join(phases, "\t")+"\tunit\t")
	for _, k := range rows {
		line := []string{k.metric, k.component}
		scale, unit := display(k.unit, cells[k])
		for _, p := range phases {
			v, ok := cells[k][p]
			line = append(line, cell(v/scale, ok, unit == "count"))
		}
		line = append(line, unit)
		fmt.Fprintln(tw, strings.Join(line, "\t")+"\t")
	}
	_ = tw.Flush()
	for _, n := range r.notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
	fmt.Fprintf(w, "logs: %s\n", r.LogDir)
}

// display is how the table shows a row's unit: bytes in B, KiB or MiB,
// whichever suits the row's largest value.
func display(unit string, values map[string]float64) (scale float64, shown string) {
	if unit != "B" && unit != "B/s" {
		return 1, unit
	}
	top := 0.0
	for _, v := range values {
		top = max(top, v)
	}
	suffix := strings.TrimPrefix(unit, "B")
	switch {
	case top >= 1<<20:
		return 1 << 20, "MiB" + suffix
	case top >= 1<<10:
		return 1 << 10, "KiB" + suffix
	}
	return 1, unit
}

// cell shows a value with three significant digits (more when it is
// larger), a count whole.
func cell(v float64, ok, whole bool) string {
	switch {
	case !ok:
		return "-"
	case whole || v == 0 || v >= 100 || v <= -100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10 || v <= -10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.3g", v)
	}
}

// percentile is the p-th percentile (0 to 100) of ds, by nearest rank;
// 0 for none.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(p/100*float64(len(s))+0.5) - 1
	return s[max(0, min(i, len(s)-1))]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
