package placement_test

import (
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/skiff-dev/skiff/shared/placement"
)

func TestOptionsValidate(t *testing.T) {
	for _, tc := range []struct {
		name    string
		mutate  func(*placement.Options)
		wantErr []string
	}{
		{"defaults", func(*placement.Options) {}, nil},
		{"sample of one", func(o *placement.Options) { o.SampleSize = 1 }, nil},
		{"zero sample", func(o *placement.Options) { o.SampleSize = 0 }, []string{"--placement-sample-size"}},
		{"negative attempts", func(o *placement.Options) { o.MaxAttempts = -1 }, []string{"--placement-max-attempts"}},
		{"short hold", func(o *placement.Options) { o.MaxHold = 500 * time.Millisecond }, []string{"--placement-max-hold"}},
		{"both", func(o *placement.Options) { o.SampleSize, o.MaxAttempts = 0, 0 },
			[]string{"--placement-sample-size", "--placement-max-attempts"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := placement.NewOptions()
			tc.mutate(&o)
			err := o.Validate()
			if (err != nil) != (len(tc.wantErr) > 0) {
				t.Fatalf("Validate() = %v, want errors naming %v", err, tc.wantErr)
			}
			for _, flag := range tc.wantErr {
				if !strings.Contains(err.Error(), flag) {
					t.Errorf("Validate() = %q, want it to name %s", err, flag)
				}
			}
		})
	}
}

func TestOptionsAddFlags(t *testing.T) {
	o := placement.NewOptions()
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	o.AddFlags(fs)
	for flag, want := range map[string]string{"placement-sample-size": "3", "placement-max-attempts": "3", "placement-max-hold": "30s"} {
		if got := fs.Lookup(flag).DefValue; got != want {
			t.Errorf("--%s default = %q, want %q", flag, got, want)
		}
	}
	if err := fs.Parse([]string{"--placement-sample-size=5", "--placement-max-attempts=7", "--placement-max-hold=1m"}); err != nil {
		t.Fatal(err)
	}
	if o.SampleSize != 5 || o.MaxAttempts != 7 || o.MaxHold != time.Minute {
		t.Fatalf("options = %+v, want sample size 5, max attempts 7, max hold 1m", o)
	}
}
