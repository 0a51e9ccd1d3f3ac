package v1beta1

import (
	"errors"
	"fmt"
	"unicode/utf8"
)

// Validate checks e against what the CRDs' schema checks of an entry of
// spec.sandboxes, for entries the apiserver does not see field by field
// (NodeInventoryShardSpec.Packed). Lengths are in characters, as the
// schema's maxLength and CEL's size count them.
func (e *SandboxEntry) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if !validID(e.ID) {
		bad("id %q: not 20 lowercase letters and digits", e.ID)
	}
	if n := utf8.RuneCountInString(e.Template); n < 1 || n > 63 {
		bad("template: %d characters, want 1 to 63", n)
	}
	switch e.State {
	case SandboxRunning, SandboxPaused:
		if e.Team == "" {
			bad("a running or paused sandbox belongs to a team")
		}
	case SandboxWarm:
	default:
		bad("state %q: not running, paused or warm", e.State)
	}
	for _, f := range []struct {
		name  string
		value string
		max   int
	}{{"pool", e.Pool, 317}, {"team", e.Team, 63}, {"envdVersion", e.EnvdVersion, MaxEnvdVersionLength}} {
		if n := utf8.RuneCountInString(f.value); n > f.max {
			bad("%s: %d characters, past %d", f.name, n, f.max)
		}
	}
	if e.StartedAt.IsZero() {
		bad("startedAt: missing")
	}
	if e.CPUMilli < 0 || e.MemoryMiB < 0 || e.DiskMiB < 0 {
		bad("negative resources (cpu %d, memory %d, disk %d)", e.CPUMilli, e.MemoryMiB, e.DiskMiB)
	}
	if len(e.Metadata) > 8 {
		bad("metadata: %d entries, past 8", len(e.Metadata))
	}
	total := 0
	for k, v := range e.Metadata {
		nk, nv := utf8.RuneCountInString(k), utf8.RuneCountInString(v)
		if nk > 64 {
			bad("metadata keys are at most 64 bytes")
		}
		if nv > 192 {
			bad("metadata values are at most 192 bytes")
		}
		total += nk + nv
	}
	if total > 192 {
		bad("metadata keys and values are at most 192 bytes together")
	}
	return errors.Join(errs...)
}

// validID reports whether id matches ^[a-z0-9]{20}$.
func validID(id string) bool {
	if len(id) != 20 {
		return false
	}
	for i := range len(id) {
		if c := id[i]; (c < 'a' || c > 'z') && (c < '0' || c > '9') {
			return false
		}
	}
	return true
}
