// Package harness lets a command use the helpers that take a testing.TB
// (shared/testing/kubetest, hosttest, e2e/internal/fleetenv): its TB logs
// to a writer, ends the run on Fatal or Skip, and runs the cleanups the
// helpers register, last registered first, when the run ends — after a
// failure, a panic or an interrupt as well as after success — as the
// testing package does for a test. Like a test's, its FailNow and Fatal
// must be called on the run's own goroutine.
package harness

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"testing"
)

// TB is the testing.TB of one Run.
type TB struct {
	// testing.TB has an unexported method; a nil embedded TB supplies it.
	// Every exported method is TB's own, so nothing reaches the nil.
	testing.TB

	name   string
	out    io.Writer
	ctx    context.Context
	cancel context.CancelFunc

	mu       sync.Mutex
	cleanups []func()
	failed   bool
	skipped  bool
	msgs     []string // what Error, Fatal and Skip said
}

// stop is FailNow's panic value, recovered by Run.
type stop struct{}

// ErrFailed is wrapped by Run's error when the TB failed.
var ErrFailed = errors.New("failed")

// Run calls fn with a TB named name whose logs go to out, then runs the
// TB's cleanups (its Context ends first). It returns fn's error, joined
// with one wrapping ErrFailed that says what Error, Fatal or Skip said
// when the TB failed; a panic in fn is re-raised after the cleanups.
func Run(ctx context.Context, name string, out io.Writer, fn func(tb *TB) error) (err error) {
	tb := &TB{name: name, out: out}
	tb.ctx, tb.cancel = context.WithCancel(ctx)
	defer func() {
		r := recover()
		if _, ok := r.(stop); ok {
			r = nil
		}
		tb.cancel()
		tb.runCleanups()
		if r != nil {
			panic(r)
		}
		if tb.Failed() || tb.Skipped() {
			tb.mu.Lock()
			err = errors.Join(err, fmt.Errorf("%s: %w: %v", name, ErrFailed, tb.msgs))
			tb.mu.Unlock()
		}
	}()
	return fn(tb)
}

func (tb *TB) runCleanups() {
	for {
		tb.mu.Lock()
		n := len(tb.cleanups)
		if n == 0 {
			tb.mu.Unlock()
			return
		}
		fn := tb.cleanups[n-1]
		tb.cleanups = tb.cleanups[:n-1]
		tb.mu.Unlock()
		tb.cleanup(fn)
	}
}

// cleanup runs one cleanup; a cleanup that calls FailNow ends only
// itself, as in a test.
func (tb *TB) cleanup(fn func()) {
	defer func() {
		if r := recover(); r != nil {
			if _, ok := r.(stop); !ok {
				tb.Errorf("cleanup panicked: %v", r)
			}
		}
	}()
	fn()
}

// Cleanup registers fn to run when the run ends.
func (tb *TB) Cleanup(fn func()) {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	tb.cleanups = append(tb.cleanups, fn)
}

// Context ends just before the cleanups run.
func (tb *TB) Context() context.Context { return tb.ctx }

// Name is the run's name.
func (tb *TB) Name() string { return tb.name }

// Helper does nothing: log lines carry no file positions.
func (tb *TB) Helper() {}

// Log writes a line to the run's log.
func (tb *TB) Log(args ...any) { tb.write(fmt.Sprintln(args...)) }

// Logf writes a line to the run's log.
func (tb *TB) Logf(format string, args ...any) { tb.write(fmt.Sprintf(format, args...) + "\n") }

func (tb *TB) write(s string) {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	_, _ = io.WriteString(tb.out, s)
}

// Error logs and marks the run failed.
func (tb *TB) Error(args ...any) { tb.fail(fmt.Sprint(args...)) }

// Errorf logs and marks the run failed.
func (tb *TB) Errorf(format string, args ...any) { tb.fail(fmt.Sprintf(format, args...)) }

func (tb *TB) fail(msg string) {
	tb.write("ERROR: " + msg + "\n")
	tb.mu.Lock()
	defer tb.mu.Unlock()
	tb.failed = true
	tb.msgs = append(tb.msgs, msg)
}

// Fail marks the run failed.
func (tb *TB) Fail() {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	tb.failed = true
}

// FailNow marks the run failed and ends it.
func (tb *TB) FailNow() {
	tb.Fail()
	panic(stop{})
}

// Failed reports whether the run failed.
func (tb *TB) Failed() bool {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	return tb.failed
}

// Fatal is Error, then FailNow.
func (tb *TB) Fatal(args ...any) { tb.Error(args...); tb.FailNow() }

// Fatalf is Errorf, then FailNow.
func (tb *TB) Fatalf(format string, args ...any) { tb.Errorf(format, args...); tb.FailNow() }

// Skip ends the run: a command cannot skip what it was asked to do, so
// Run reports it as a failure, with the reason.
func (tb *TB) Skip(args ...any) { tb.skip(fmt.Sprint(args...)) }

// Skipf is Skip with a format.
func (tb *TB) Skipf(format string, args ...any) { tb.skip(fmt.Sprintf(format, args...)) }

// SkipNow is Skip without a reason.
func (tb *TB) SkipNow() { tb.skip("skipped") }

func (tb *TB) skip(msg string) {
	tb.write("SKIP: " + msg + "\n")
	tb.mu.Lock()
	tb.skipped = true
	tb.msgs = append(tb.msgs, "skipped: "+msg)
	tb.mu.Unlock()
	panic(stop{})
}

// Skipped reports whether Skip was called.
func (tb *TB) Skipped() bool {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	return tb.skipped
}

// TempDir returns a new folder, removed when the run ends.
func (tb *TB) TempDir() string {
	dir, err := os.MkdirTemp("", "skiff-"+tb.name+"-")
	if err != nil {
		tb.Fatalf("temp dir: %v", err)
	}
	tb.Cleanup(func() {
		if err := os.RemoveAll(dir); err != nil {
			tb.Errorf("remove %s: %v", dir, err)
		}
	})
	return dir
}

// ArtifactDir is a TempDir: a command keeps nothing of its helpers'.
func (tb *TB) ArtifactDir() string { return tb.TempDir() }

// Setenv sets an environment variable until the run ends.
func (tb *TB) Setenv(key, value string) {
	prev, had := os.LookupEnv(key)
	if err := os.Setenv(key, value); err != nil {
		tb.Fatalf("setenv %s: %v", key, err)
	}
	tb.Cleanup(func() {
		if had {
			_ = os.Setenv(key, prev)
		} else {
			_ = os.Unsetenv(key)
		}
	})
}

// Chdir changes the working directory until the run ends.
func (tb *TB) Chdir(dir string) {
	prev, err := os.Getwd()
	if err != nil {
		tb.Fatalf("chdir: %v", err)
	}
	if err := os.Chdir(dir); err != nil {
		tb.Fatalf("chdir %s: %v", dir, err)
	}
	tb.Cleanup(func() { _ = os.Chdir(prev) })
}

// Attr logs an attribute.
func (tb *TB) Attr(key, value string) { tb.Logf("=== ATTR %s %s", key, value) }

// Output is the run's log.
func (tb *TB) Output() io.Writer { return writerFunc(tb.write) }

type writerFunc func(string)

func (w writerFunc) Write(p []byte) (int, error) { w(string(p)); return len(p), nil }
