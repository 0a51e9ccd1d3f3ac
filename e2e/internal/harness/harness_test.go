package harness

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strings"
	"testing"
)

func TestRun(t *testing.T) {
	for _, tc := range []struct {
		name    string
		fn      func(tb *TB) error
		wantErr string // "" for none
		failed  bool
	}{
		{"passes", func(*TB) error { return nil }, "", false},
		{"returns an error", func(*TB) error { return errors.New("boom") }, "boom", false},
		{"Fatal ends the run", func(tb *TB) error { tb.Fatalf("no %s", "luck"); panic("not reached") }, "no luck", true},
		{"Errorf goes on", func(tb *TB) error { tb.Errorf("bad"); return nil }, "bad", true},
		{"Skip is a failure", func(tb *TB) error { tb.Skip("needs root"); return nil }, "skipped: needs root", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var order []string
			var log bytes.Buffer
			var ctxErr error
			var dir string
			err := Run(t.Context(), "test", &log, func(tb *TB) error {
				dir = tb.TempDir()
				tb.Cleanup(func() { order = append(order, "first"); ctxErr = tb.Context().Err() })
				tb.Cleanup(func() { order = append(order, "second") })
				return tc.fn(tb)
			})
			switch {
			case tc.wantErr == "" && err != nil:
				t.Errorf("Run: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Errorf("Run: %v, want %q", err, tc.wantErr)
			}
			if tc.failed && !errors.Is(err, ErrFailed) {
				t.Errorf("Run: %v, want ErrFailed", err)
			}
			if strings.Join(order, ",") != "second,first" {
				t.Errorf("cleanups ran %v, want last registered first", order)
			}
			if !errors.Is(ctxErr, context.Canceled) {
				t.Errorf("the context in a cleanup: %v, want canceled", ctxErr)
			}
			if _, err := os.Stat(dir); !os.IsNotExist(err) {
				t.Errorf("TempDir %s left: %v", dir, err)
			}
		})
	}
}

// A panic runs the cleanups, then goes on.
func TestRunPanics(t *testing.T) {
	cleaned := false
	defer func() {
		if r := recover(); r != "boom" || !cleaned {
			t.Errorf("recovered %v, cleaned %v", r, cleaned)
		}
	}()
	_ = Run(t.Context(), "test", &bytes.Buffer{}, func(tb *TB) error {
		tb.Cleanup(func() { cleaned = true })
		panic("boom")
	})
}
