package kubeinventory

import (
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

func TestOptionsValidate(t *testing.T) {
	for _, tc := range []struct {
		name       string
		staleAfter time.Duration
		wantErr    bool
	}{
		{"default", DefaultStaleAfter, false},
		{"one nanosecond", time.Nanosecond, false},
		{"zero", 0, true},
		{"negative", -time.Second, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := NewOptions()
			o.StaleAfter = tc.staleAfter
			err := o.Validate()
			if (err != nil) != tc.wantErr {
				t.Fatalf("Validate() = %v, wantErr %v", err, tc.wantErr)
			}
			if err != nil && !strings.Contains(err.Error(), "--inventory-stale-after") {
				t.Fatalf("Validate() = %q, want it to name the flag", err)
			}
		})
	}
}

func TestOptionsAddFlags(t *testing.T) {
	o := NewOptions()
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	o.AddFlags(fs)
	if got := fs.Lookup("inventory-stale-after").DefValue; got != "1m30s" {
		t.Fatalf("default = %q, want 1m30s", got)
	}
	if err := fs.Parse([]string{"--inventory-stale-after=2m"}); err != nil {
		t.Fatal(err)
	}
	if o.StaleAfter != 2*time.Minute {
		t.Fatalf("StaleAfter = %s, want 2m", o.StaleAfter)
	}
}
