package placement_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/skiff-dev/skiff/api/v1beta1"
	"github.com/skiff-dev/skiff/shared/inventory"
	"github.com/skiff-dev/skiff/shared/placement"
)

// warmFleet returns nodes a, b and c, each with warm sandboxes of base
// <node>0 and <node>1, and a running one and a warm py one that no claim of
// base may take.
func warmFleet() *inventory.StaticSource {
	src := inventory.NewStaticSource()
	for _, name := range []string{"a", "b", "c"} {
		n := node(name, res(10_000, 1<<20, 100), res(0, 0, 0), "base", "py")
		for i, sb := range []struct {
			template string
			state    v1beta1.SandboxState
		}{{"base", v1beta1.SandboxWarm}, {"base", v1beta1.SandboxWarm}, {"base", v1beta1.SandboxRunning}, {"py", v1beta1.SandboxWarm}} {
			n.Spec.Sandboxes = append(n.Spec.Sandboxes, v1beta1.SandboxEntry{
				ID: fmt.Sprintf("%s%d", name, i), Template: sb.template, State: sb.state, Pool: "team/" + sb.template,
			})
		}
		src.Apply(n)
	}
	return src
}

// claimer is a claim that records the sandboxes it is called on and fails on
// those in fail, or on every one when all is set.
type claimer struct {
	mu    sync.Mutex
	calls []string
	fail  map[string]error
	all   error
}

func (c *claimer) claim(_ context.Context, cand inventory.Candidate) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls = append(c.calls, cand.SandboxID)
	if err, ok := c.fail[cand.SandboxID]; ok {
		return err
	}
	return c.all
}

func TestClaim(t *testing.T) {
	conflict := fmt.Errorf("sandboxd: %w", placement.ErrClaimConflict)
	gone := fmt.Errorf("dial: %w", placement.ErrNodeUnavailable)
	warm := []string{"a0", "a1", "b0", "b1", "c0", "c1"}
	for _, tc := range []struct {
		name     string
		template string
		limit    int
		claimer  *claimer
		// wantCalls is how many claims are made; wantLast, if set, is the
		// sandbox the last one is made on.
		wantCalls int
		wantLast  string
		wantErr   []error
	}{
		{"first wins", "base", 3, &claimer{}, 1, "", nil},
		{"conflicts move on", "base", 6, &claimer{all: conflict, fail: map[string]error{"b1": nil}}, -1, "b1", nil},
		{"unavailable moves on", "base", 6, &claimer{all: gone, fail: map[string]error{"c0": nil}}, -1, "c0", nil},
		{"every candidate conflicts", "base", 10, &claimer{all: conflict}, 6, "", []error{placement.ErrNoWarm, placement.ErrClaimConflict}},
		{"limit bounds the candidates", "base", 2, &claimer{all: conflict}, 2, "", []error{placement.ErrNoWarm}},
		{"default limit", "base", 0, &claimer{all: conflict}, placement.DefaultClaimLimit, "", []error{placement.ErrNoWarm}},
		{"other errors stop", "base", 6, &claimer{all: errBoom}, 1, "", []error{errBoom}},
		{"only warm sandboxes of the template", "py", 10, &claimer{all: conflict}, 3, "", []error{placement.ErrNoWarm}},
		{"no warm sandbox", "go", 10, &claimer{}, 0, "", []error{placement.ErrNoWarm}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := placement.New(warmFleet(), placement.Options{})
			got, err := p.Claim(t.Context(), tc.template, tc.limit, tc.claimer.claim)
			calls := tc.claimer.calls
			if tc.wantCalls >= 0 && len(calls) != tc.wantCalls {
				t.Errorf("claim called on %v, want %d calls", calls, tc.wantCalls)
			}
			if tc.wantLast != "" && (len(calls) == 0 || calls[len(calls)-1] != tc.wantLast) {
				t.Errorf("claim called on %v, want the last on %s", calls, tc.wantLast)
			}
			if len(calls) != len(slices.Compact(slices.Sorted(slices.Values(calls)))) {
				t.Errorf("claim called on %v, want each sandbox once", calls)
			}
			for _, id := range calls {
				if tc.template == "base" && !slices.Contains(warm, id) {
					t.Errorf("claim called on %s, not a warm base sandbox", id)
				}
			}
			if len(tc.wantErr) == 0 {
				if err != nil || got.SandboxID != calls[len(calls)-1] || got.Endpoint != got.Node+":27777" {
					t.Fatalf("Claim = %+v, %v; want the candidate of the last claim, %v", got, err, calls)
				}
				return
			}
			if got != (inventory.Candidate{}) {
				t.Errorf("Claim = %+v on error, want the zero candidate", got)
			}
			for _, want := range tc.wantErr {
				if !errors.Is(err, want) {
					t.Errorf("Claim error = %v, want it to wrap %v", err, want)
				}
			}
			if slices.Contains(tc.wantErr, errBoom) && errors.Is(err, placement.ErrNoWarm) {
				t.Errorf("Claim error = %v: an error that stops is not ErrNoWarm, or the caller would cold-create", err)
			}
		})
	}
}

// TestClaimCustomClassifier proves Options.ClaimRetryable replaces the
// default.
func TestClaimCustomClassifier(t *testing.T) {
	errTaken := errors.New("taken")
	p := placement.New(warmFleet(), placement.Options{ClaimRetryable: func(err error) bool { return errors.Is(err, errTaken) }})
	c := &claimer{all: errTaken}
	if _, err := p.Claim(t.Context(), "base", 4, c.claim); !errors.Is(err, placement.ErrNoWarm) || len(c.calls) != 4 {
		t.Fatalf("Claim = %v after %v, want ErrNoWarm after 4 claims", err, c.calls)
	}
	c = &claimer{all: fmt.Errorf("sandboxd: %w", placement.ErrClaimConflict)}
	if _, err := p.Claim(t.Context(), "base", 4, c.claim); errors.Is(err, placement.ErrNoWarm) || len(c.calls) != 1 {
		t.Fatalf("Claim = %v after %v, want the conflict after 1 claim", err, c.calls)
	}
}

// TestClaimContext proves a done context stops a claim: before any call, and
// after a call that failed because of it, without trying the next candidate
// or reporting ErrNoWarm (which would start a cold create).
func TestClaimContext(t *testing.T) {
	p := placement.New(warmFleet(), placement.Options{})
	t.Run("canceled before", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		c := &claimer{}
		if _, err := p.Claim(ctx, "base", 3, c.claim); !errors.Is(err, context.Canceled) || len(c.calls) != 0 {
			t.Fatalf("Claim = %v after %v, want context.Canceled and no claim", err, c.calls)
		}
	})
	t.Run("canceled during claim", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		calls := 0
		_, err := p.Claim(ctx, "base", 3, func(ctx context.Context, _ inventory.Candidate) error {
			calls++
			cancel()
			return fmt.Errorf("%w: %w", placement.ErrNodeUnavailable, ctx.Err())
		})
		if calls != 1 || errors.Is(err, placement.ErrNoWarm) || !errors.Is(err, context.Canceled) {
			t.Fatalf("Claim = %v after %d claims, want the claim's error after 1", err, calls)
		}
	})
	t.Run("source fails", func(t *testing.T) {
		c := &claimer{}
		_, err := placement.New(failingSource{}, placement.Options{}).Claim(t.Context(), "base", 3, c.claim)
		if !errors.Is(err, errList) || errors.Is(err, placement.ErrNoWarm) || len(c.calls) != 0 {
			t.Fatalf("Claim = %v after %v, want the source's error and no claim", err, c.calls)
		}
	})
}
