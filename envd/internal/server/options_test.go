package server

import (
	"testing"

	"github.com/spf13/pflag"
)

func TestOptionsValidate(t *testing.T) {
	for _, tc := range []struct {
		name    string
		mut     func(*Options)
		wantErr bool
	}{
		{"defaults", func(*Options) {}, false},
		{"port 0 picks one", func(o *Options) { o.Port = 0 }, false},
		{"negative port", func(o *Options) { o.Port = -1 }, true},
		{"port too high", func(o *Options) { o.Port = 65536 }, true},
		{"no address", func(o *Options) { o.ListenAddress = "" }, true},
		{"no output budget", func(o *Options) { o.LogOutputLimit = 0 }, true},
		{"no log budget", func(o *Options) { o.LogLimit = 0 }, true},
		{"listen fd 2", func(o *Options) { o.ListenFD = 2 }, true},
		{"workload cgroup fd", func(o *Options) { o.ListenFD, o.WorkloadCgroupFD = 3, 4 }, false},
		{"workload cgroup fd 1", func(o *Options) { o.WorkloadCgroupFD = 1 }, true},
		{"workload cgroup fd is the listen fd", func(o *Options) { o.ListenFD, o.WorkloadCgroupFD = 3, 3 }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := NewOptions()
			tc.mut(&o)
			if err := o.Validate(); (err != nil) != tc.wantErr {
				t.Fatalf("Validate() = %v, wantErr %v", err, tc.wantErr)
			}
		})
	}
}

// --log-process-output follows --init unless given.
func TestComplete(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want bool
	}{
		{nil, false},
		{[]string{"--init"}, true},
		{[]string{"--init", "--log-process-output=false"}, false},
		{[]string{"--log-process-output"}, true},
	} {
		o := NewOptions()
		o.Init = false // not PID 1
		fs := pflag.NewFlagSet("envd", pflag.ContinueOnError)
		o.AddFlags(fs)
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		if err := o.Complete(); err != nil {
			t.Fatal(err)
		}
		if o.LogProcessOutput != tc.want {
			t.Errorf("%v: LogProcessOutput = %v, want %v", tc.args, o.LogProcessOutput, tc.want)
		}
	}
}
