// Command skiff-plot draws the scaling benchmarks' results as PNG plots for
// docs/scaling-design.md, from the JSON lines the benchmarks wrote:
// skiff-bench's (density, lifecycle and floor) and skiff-fleetsim's (the
// control plane against simulated hosts), one file per series (before and
// after a change, say). make plots runs it on docs/scaling/*.jsonl.
//
//	skiff-plot --series after=docs/scaling/density-after.jsonl --fleet after=docs/scaling/fleet-after.jsonl --out docs/scaling
package main

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"image/color"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/spf13/pflag"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"

	"github.com/skiff-dev/skiff/e2e/internal/fleetbench"
	"github.com/skiff-dev/skiff/e2e/internal/hostbench"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "skiff-plot:", err)
		os.Exit(1)
	}
}

// series is one skiff-bench results file and its name in the legends.
type series struct {
	name    string
	results []hostbench.Result
}

func run(args []string) error {
	fs := pflag.NewFlagSet("skiff-plot", pflag.ContinueOnError)
	specs := fs.StringArray("series", nil, "name=FILE: skiff-bench results (JSON lines) drawn as one series; repeatable.")
	fleetSpecs := fs.StringArray("fleet", nil, "name=FILE: skiff-fleetsim results (JSON lines; the newest run in it) drawn as one series of the fleet plots; repeatable.")
	out := fs.String("out", ".", "Folder the PNG files are written to.")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return nil
		}
		return err
	}
	var all []series
	for _, s := range *specs {
		name, file, ok := strings.Cut(s, "=")
		if !ok || name == "" || file == "" {
			return fmt.Errorf("--series %q: want name=FILE", s)
		}
		f, err := os.Open(file)
		if err != nil {
			return err
		}
		rs, err := hostbench.ReadResults(f)
		f.Close()
		if err != nil {
			return fmt.Errorf("%s: %w", file, err)
		}
		all = append(all, series{name, rs})
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return err
	}
	var plots []*figure
	if len(all) > 0 {
		plots = append(plots, hostPlots(all)...)
	}
	var runs []fleetRun
	for _, spec := range *fleetSpecs {
		name, file, ok := strings.Cut(spec, "=")
		if !ok || name == "" || file == "" {
			return fmt.Errorf("--fleet %q: want name=FILE", spec)
		}
		f, err := os.Open(file)
		if err != nil {
			return err
		}
		rs, err := readFleet(f)
		f.Close()
		if err != nil {
			return fmt.Errorf("%s: %w", file, err)
		}
		runs = append(runs, fleetRun{name, rs})
	}
	if len(runs) > 0 {
		for _, b := range fleetPlots(runs) {
			path := filepath.Join(*out, b.file)
			if err := b.save(path); err != nil {
				return fmt.Errorf("%s: %w", path, err)
			}
			fmt.Println("wrote", path)
		}
	}
	for _, p := range plots {
		if len(p.lines) == 0 {
			continue
		}
		path := filepath.Join(*out, p.file)
		if err := p.save(path); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		fmt.Println("wrote", path)
	}
	return nil
}

// figure is one plot: lines of (x, y) points.
type figure struct {
	file, title, x, y string
	logX              bool
	lines             []line
}

type line struct {
	name   string
	points plotter.XYs
	dashed bool
}

func (f *figure) add(name string, pts plotter.XYs, dashed bool) {
	if len(pts) > 0 {
		slices.SortFunc(pts, func(a, b plotter.XY) int { return cmp.Compare(a.X, b.X) })
		f.lines = append(f.lines, line{name, pts, dashed})
	}
}

func (f *figure) save(path string) error {
	p := plot.New()
	p.Title.Text = f.title
	p.X.Label.Text = f.x
	p.Y.Label.Text = f.y
	p.Y.Min = 0
	p.Legend.Top = true
	p.Legend.Left = true
	p.Add(plotter.NewGrid())
	if f.logX {
		p.X.Scale = plot.LogScale{}
		p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	}
	for i, l := range f.lines {
		lp, pts, err := plotter.NewLinePoints(l.points)
		if err != nil {
			return err
		}
		c := plotutil.Color(i)
		lp.Color, pts.Color = c, c
		pts.Shape = plotutil.Shape(i)
		if l.dashed {
			lp.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
			lp.Color = color.Gray{Y: 96}
			pts.Color = lp.Color
		}
		p.Add(lp, pts)
		p.Legend.Add(l.name, lp, pts)
	}
	return p.Save(7*vg.Inch, 4*vg.Inch, path)
}

// hostPlots are skiff-bench's: density and lifecycle.
func hostPlots(all []series) []*figure {
	create := &figure{file: "density-create.png", title: "Create latency while idle sandboxes accumulate (c=1, through the e2b API)", x: "sandboxes running", y: "create latency of that hundred (ms)"}
	mem := &figure{file: "density-memory.png", title: "Host memory per idle sandbox", x: "sandboxes running", y: "MiB per sandbox"}
	cpu := &figure{file: "lifecycle-cpu.png", title: "CPU per create → run → kill, beside the floor (clone + exec)", x: "concurrency", y: "host CPU ms per lifecycle", logX: true}
	rate := &figure{file: "lifecycle-rate.png", title: "Lifecycles per second on 2 cores (load generator included)", x: "concurrency", y: "per second", logX: true}
	for _, s := range all {
		pick := func(bench, metric string) plotter.XYs {
			var pts plotter.XYs
			for _, r := range s.results {
				if r.Bench == bench && r.Metric == metric {
					// The last value at each x wins (density samples its
					// last point twice: before and after settling).
					if i := slices.IndexFunc(pts, func(p plotter.XY) bool { return p.X == float64(r.At) }); i >= 0 {
						pts[i].Y = r.Value
						continue
					}
					pts = append(pts, plotter.XY{X: float64(r.At), Y: r.Value})
				}
			}
			return pts
		}
		create.add(s.name+" p50", pick("density", "create_p50"), false)
		create.add(s.name+" p99", pick("density", "create_p99"), false)
		mem.add(s.name+": MemAvailable's fall", pick("density", "host_memory_per_sandbox"), false)
		mem.add(s.name+": PSS of the sandboxes' processes", pick("density", "sandbox_pss_per_sandbox"), false)
		cpu.add(s.name+": lifecycle", pick("lifecycle", "cpu_ms_host"), false)
		rate.add(s.name+": lifecycles", pick("lifecycle", "rate"), false)
		floor := pick("floor", "cpu_ms_host")
		cpu.add(s.name+": floor", floor, true)
		var three plotter.XYs
		for _, p := range floor {
			three = append(three, plotter.XY{X: p.X, Y: 3 * p.Y})
		}
		cpu.add(s.name+": 3 × floor (goal)", three, true)
		rate.add(s.name+": floor starts", pick("floor", "rate"), true)
	}
	return []*figure{create, mem, cpu, rate}
}

// readFleet reads skiff-fleetsim's results and keeps the newest run's.
func readFleet(r io.Reader) ([]fleetbench.Result, error) {
	var all []fleetbench.Result
	dec := json.NewDecoder(r)
	for dec.More() {
		var res fleetbench.Result
		if err := dec.Decode(&res); err != nil {
			return nil, err
		}
		all = append(all, res)
	}
	var newest fleetbench.Result
	for _, r := range all {
		if r.Time.After(newest.Time) {
			newest = r
		}
	}
	return slices.DeleteFunc(all, func(r fleetbench.Result) bool { return !r.Time.Equal(newest.Time) }), nil
}

// fleetRun is one skiff-fleetsim run and its name in the legends.
type fleetRun struct {
	name    string
	results []fleetbench.Result
}

// bars is a bar chart: for each run, one bar per category.
type bars struct {
	file, title, y string
	categories     []string
	runs           []string
	values         [][]float64 // [run][category]
}

func (b *bars) save(path string) error {
	p := plot.New()
	p.Title.Text = b.title
	p.Y.Label.Text = b.y
	p.Legend.Top, p.Legend.Left = true, true
	p.Add(plotter.NewGrid())
	w := vg.Points(14)
	for i, run := range b.runs {
		bc, err := plotter.NewBarChart(plotter.Values(b.values[i]), w)
		if err != nil {
			return err
		}
		bc.LineStyle.Width = vg.Length(0)
		bc.Color = plotutil.Color(i)
		bc.Offset = w * vg.Length(float64(i)-float64(len(b.runs)-1)/2)
		p.Add(bc)
		p.Legend.Add(run, bc)
	}
	p.NominalX(b.categories...)
	return p.Save(9*vg.Inch, 4*vg.Inch, path)
}

// fleetPlots compare skiff-fleetsim runs (before and after a change, at
// one fleet size) phase by phase.
func fleetPlots(runs []fleetRun) []*bars {
	value := func(rs []fleetbench.Result, phase, metric, component string) float64 {
		for _, r := range rs {
			if r.Phase == phase && r.Metric == metric && r.Component == component {
				return r.Value
			}
		}
		return 0
	}
	type col struct {
		label, phase, metric, component string
		scale                           float64 // 0: the chart's
	}
	chart := func(file, title, y string, scale float64, cols ...col) *bars {
		b := &bars{file: file, title: title, y: y}
		for _, c := range cols {
			// The phase on a line of its own: the labels are long.
			if i := strings.LastIndexByte(c.label, ' '); i > 0 {
				c.label = c.label[:i] + "\n" + c.label[i+1:]
			}
			b.categories = append(b.categories, c.label)
		}
		for _, run := range runs {
			b.runs = append(b.runs, run.name)
			var vs []float64
			for _, c := range cols {
				sc := scale
				if c.scale != 0 {
					sc = c.scale
				}
				vs = append(vs, value(run.results, c.phase, c.metric, c.component)*sc)
			}
			b.values = append(b.values, vs)
		}
		return b
	}
	s, c := fleetbench.PhaseSteady, fleetbench.PhaseChurn
	return []*bars{
		chart("fleet-cpu.png", "CPU of the control plane and the readers (steady, and churn of 1%/s)", "% of one core", 1,
			col{"kube-apiserver steady", s, "cpu", "kube-apiserver", 0}, col{"kube-apiserver churn", c, "cpu", "kube-apiserver", 0},
			col{"sandbox-apiserver steady", s, "cpu", "sandbox-apiserver", 0}, col{"sandbox-apiserver churn", c, "cpu", "sandbox-apiserver", 0},
			col{"proxy steady", s, "cpu", "sandbox-envd-proxy", 0}, col{"etcd steady", s, "cpu", "etcd", 0}),
		chart("fleet-memory.png", "Resident memory (steady, and churn of 1%/s)", "MiB (RSS)", 1.0/(1<<20),
			col{"kube-apiserver steady", s, "rss", "kube-apiserver", 0}, col{"kube-apiserver churn", c, "rss", "kube-apiserver", 0},
			col{"sandbox-apiserver steady", s, "rss", "sandbox-apiserver", 0}, col{"etcd churn", c, "rss", "etcd", 0},
			col{"proxy steady", s, "rss", "sandbox-envd-proxy", 0}),
		chart("fleet-writes.png", "Inventory writes: etcd WAL bytes, and a write's latency", "MB/s; s", 1,
			col{"etcd MB/s steady", s, "etcd_wal_write", "etcd", 1e-6}, col{"etcd MB/s churn", c, "etcd_wal_write", "etcd", 1e-6},
			col{"write p50 (s) steady", s, "inventory_apply_p50", "hosts", 1e-3}, col{"write p50 (10 s) churn", c, "inventory_apply_p50", "hosts", 1e-4}),
		chart("fleet-latency.png", "Reads and creates (p50)", "ms", 1,
			col{"e2b list page steady", s, "e2b_list_page_p50", "sandbox-apiserver", 0}, col{"e2b list page churn", c, "e2b_list_page_p50", "sandbox-apiserver", 0},
			col{"kubectl page steady", s, "kubectl_list_page_p50", "sandbox-apiserver", 0}, col{"kubectl page churn", c, "kubectl_list_page_p50", "sandbox-apiserver", 0},
			col{"create churn", c, "create_p50", "sandbox-apiserver", 0}),
	}
}
