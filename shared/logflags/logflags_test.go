package logflags

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

func parse(t *testing.T, format string, args ...string) Options {
	t.Helper()
	o := New(format)
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	o.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return o
}

func TestLevelAndFormat(t *testing.T) {
	for _, tc := range []struct {
		name       string
		format     string
		args       []string
		wantDebug  bool
		wantInfo   bool
		wantJSON   bool
		wantErrSub string
	}{
		{name: "defaults, text", format: Text, wantInfo: true},
		{name: "defaults, json", format: JSON, wantInfo: true, wantJSON: true},
		{name: "debug", format: Text, args: []string{"--log-level", "debug"}, wantDebug: true, wantInfo: true},
		{name: "warn hides info", format: Text, args: []string{"--log-level=WARN"}},
		{name: "json by flag", format: Text, args: []string{"--log-format", "json"}, wantInfo: true, wantJSON: true},
		{name: "bad level", format: Text, args: []string{"--log-level", "loud"}, wantErrSub: "--log-level"},
		{name: "bad format", format: Text, args: []string{"--log-format", "xml"}, wantErrSub: "--log-format"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := parse(t, tc.format, tc.args...)
			var buf bytes.Buffer
			log, err := o.Logger(&buf)
			if tc.wantErrSub != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErrSub) {
					t.Fatalf("Logger() error = %v, want one naming %s", err, tc.wantErrSub)
				}
				if o.Validate() == nil {
					t.Fatal("Validate() accepted what Logger refused")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			log.Debug("d")
			log.Info("i", "k", "v")
			out := buf.String()
			if got := strings.Contains(out, "msg=d") || strings.Contains(out, `"msg":"d"`); got != tc.wantDebug {
				t.Errorf("debug line logged = %v, want %v:\n%s", got, tc.wantDebug, out)
			}
			if got := strings.Contains(out, "msg=i") || strings.Contains(out, `"msg":"i"`); got != tc.wantInfo {
				t.Errorf("info line logged = %v, want %v:\n%s", got, tc.wantInfo, out)
			}
			if tc.wantJSON && out != "" {
				for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
					var m map[string]any
					if err := json.Unmarshal([]byte(line), &m); err != nil {
						t.Errorf("not a JSON line: %q", line)
					}
				}
			}
			if !tc.wantJSON && strings.HasPrefix(out, "{") {
				t.Errorf("JSON where text was asked for:\n%s", out)
			}
		})
	}
}
