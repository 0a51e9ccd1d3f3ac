package server_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/skiff-dev/skiff/envd/internal/hosttest"
)

// benchBinEnv names the envd binary the benchmarks start.
const benchBinEnv = "ENVD_BENCH_BIN"

// TestMain runs the tests where root's and the users' homes are empty
// (hosttest): they run envd's routes and shells as root. The benchmarks'
// envd is built first, outside, where go build finds its caches (in root's
// home), and handed on in $ENVD_BENCH_BIN.
func TestMain(m *testing.M) {
	if !hosttest.Outside() || os.Getenv(benchBinEnv) != "" || !benchmarking() {
		hosttest.Main(m)
	}
	dir, err := os.MkdirTemp("", "envd-bench-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bin := filepath.Join(dir, "envd")
	code := 1
	if err := goBuildEnvd(context.Background(), bin); err != nil {
		fmt.Fprintln(os.Stderr, err)
	} else {
		os.Setenv(benchBinEnv, bin)
		code = hosttest.Run(m)
	}
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// benchmarking reports whether the test binary was asked to run benchmarks
// (-test.bench with a pattern).
func benchmarking() bool {
	args := os.Args[1:]
	for i, a := range args {
		name, v, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if name != "test.bench" {
			continue
		}
		if !hasValue && i+1 < len(args) {
			v = args[i+1]
		}
		return v != ""
	}
	return false
}

func TestHomesAreHidden(t *testing.T) { hosttest.AssertHidden(t) }
