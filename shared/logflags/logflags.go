// Package logflags is the logging flags every Skiff daemon takes,
// --log-level and --log-format, and the logger they describe. Logs go to
// stderr; a daemon sets the logger as slog's default so that every package
// logs through it.
package logflags

import (
	"fmt"
	"io"
	"log/slog"

	"github.com/spf13/pflag"
)

// Formats are the values --log-format takes.
const (
	Text = "text" // slog's key=value lines
	JSON = "json" // one JSON object a line, for log collectors
)

// Options are the logging flags' values.
type Options struct {
	// Level is the least level logged: debug, info, warn or error.
	Level string
	// Format is Text or JSON.
	Format string
}

// New returns the options at level info in format.
func New(format string) Options { return Options{Level: "info", Format: format} }

// AddFlags registers --log-level and --log-format, defaulting to o's values.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.Level, "log-level", o.Level, "Least level logged: debug, info, warn or error.")
	fs.StringVar(&o.Format, "log-format", o.Format, "How log lines are written to stderr: text (key=value) or json (one object a line, for log collectors).")
}

// Validate reports a flag that cannot work, naming it.
func (o *Options) Validate() error {
	if _, err := o.level(); err != nil {
		return err
	}
	if o.Format != Text && o.Format != JSON {
		return fmt.Errorf("--log-format %q: want text or json", o.Format)
	}
	return nil
}

func (o *Options) level() (slog.Level, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(o.Level)); err != nil {
		return 0, fmt.Errorf("--log-level %q: want debug, info, warn or error", o.Level)
	}
	return lvl, nil
}

// Logger returns the logger the options describe, writing to w. A record
// logged in a span's context carries its trace_id and span_id
// (WithTraceIDs).
func (o *Options) Logger(w io.Writer) (*slog.Logger, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	lvl, _ := o.level()
	h := &slog.HandlerOptions{Level: lvl}
	if o.Format == JSON {
		return slog.New(WithTraceIDs(slog.NewJSONHandler(w, h))), nil
	}
	return slog.New(WithTraceIDs(slog.NewTextHandler(w, h))), nil
}
