package fleetbench

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// pidOf finds the process running program (the base name of its argv[0])
// with arg among its arguments: a daemon by its own listen address.
func pidOf(program, arg string) (int, error) {
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if filepath.Base(args[0]) != program {
			continue
		}
		for _, a := range args[1:] {
			if a == arg {
				return strconv.Atoi(filepath.Base(filepath.Dir(p)))
			}
		}
	}
	return 0, fmt.Errorf("no %s process with argument %s", program, arg)
}

// samples sums, for each name, the samples of that metric (any labels)
// on a Prometheus text page; a name the page lacks is absent.
func samples(page string, names ...string) map[string]float64 {
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	out := map[string]float64{}
	for line := range strings.SplitSeq(page, "\n") {
		if line == "" || line[0] == '#' {
			continue
		}
		name, rest, _ := strings.Cut(line, " ")
		if i := strings.IndexByte(name, '{'); i >= 0 {
			// Labels may hold spaces: the value follows the closing brace.
			name = line[:i]
			if j := strings.LastIndexByte(line, '}'); j >= 0 {
				rest = strings.TrimSpace(line[j+1:])
			}
		}
		if !want[name] {
			continue
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			continue
		}
		if v, err := strconv.ParseFloat(f[0], 64); err == nil {
			out[name] += v
		}
	}
	return out
}
