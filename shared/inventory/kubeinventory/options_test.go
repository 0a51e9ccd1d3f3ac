package kubeinventory

import (
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

func TestOptionsValidate(t *testing.T) {
	for _, tc := range []struct {
		name                string
		staleAfter, publish time.Duration
		wantErr             string // the flag the error names; "" none
	}{
		{"default", DefaultStaleAfter, 0, ""},
		{"explicit interval", DefaultStaleAfter, 30 * time.Second, ""},
		{"one nanosecond", time.Nanosecond, time.Nanosecond, ""},
		{"interval equal to the window", 6 * time.Second, 6 * time.Second, ""},
		{"zero", 0, time.Nanosecond, "--inventory-stale-after"},
		{"negative", -time.Second, time.Nanosecond, "--inventory-stale-after"},
		{"negative interval", time.Minute, -time.Second, "--inventory-publish-interval"},
		{"interval past the window", 6 * time.Second, 6*time.Second + time.Nanosecond, "must not exceed --inventory-stale-after"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := NewOptions()
			o.StaleAfter, o.PublishInterval = tc.staleAfter, tc.publish
			err := o.Validate()
			if (err != nil) != (tc.wantErr != "") {
				t.Fatalf("Validate() = %v, want an error naming %q", err, tc.wantErr)
			}
			if err != nil && !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("Validate() = %q, want it to name %s", err, tc.wantErr)
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
	if got := fs.Lookup("inventory-publish-interval").DefValue; got != "0s" {
		t.Fatalf("default = %q, want 0s (a third of the window)", got)
	}
	if err := fs.Parse([]string{"--inventory-stale-after=2m", "--inventory-publish-interval=40s"}); err != nil {
		t.Fatal(err)
	}
	if o.StaleAfter != 2*time.Minute || o.PublishInterval != 40*time.Second {
		t.Fatalf("StaleAfter, PublishInterval = %s, %s, want 2m, 40s", o.StaleAfter, o.PublishInterval)
	}
}
