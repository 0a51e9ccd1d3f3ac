package service

import (
	"errors"
	"fmt"
	"io/fs"
	"regexp"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/skiff-dev/skiff/sandboxd/internal/template"
	pb "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
	"github.com/skiff-dev/skiff/shared/sandboxid"
)

// The bounds of a request. Metadata, team and pool have the NodeInventory
// CRD's bounds (api/v1beta1): a sandbox this host accepts must fit in the
// inventory its publisher writes.
const (
	maxMetadataEntries  = 8
	maxMetadataKeyBytes = 64
	maxMetadataBytes    = 192 // keys and values together
	maxTeamLen          = 63
	maxPoolLen          = 317
	maxEnvVars          = 256
	maxEnvBytes         = 64 << 10 // names and values together
)

// The bounds of a sandbox's resources, which its defaults (Config) must
// keep too.
const (
	MinCPUMilli  = 100
	MinMemoryMiB = 64
	MaxDiskMiB   = 1 << 20 // 1 TiB
)

var (
	templateRE = regexp.MustCompile(`^[a-z0-9]([-_.a-z0-9]{0,61}[a-z0-9])?$`)
	teamRE     = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
	poolRE     = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?/[a-z0-9]([-.a-z0-9]*[a-z0-9])?$`)
	envNameRE  = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
)

// checkTemplate checks the name and finds the template on this host.
func (s *Service) checkTemplate(f *fieldErrors, name string) (*template.Template, error) {
	if !templateRE.MatchString(name) {
		f.add("template", "%q is not a template name (1 to 63 characters of [a-z0-9-_.])", truncate(name))
		return nil, nil
	}
	t, err := s.templates.Get(name)
	if errors.Is(err, fs.ErrNotExist) {
		f.add("template", "this host has no template %q", name)
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("look up template %s: %w", name, err)
	}
	return t, nil
}

// checkTimeout checks a lifetime: present when required, above zero and at
// most --max-timeout. It returns 0 when absent.
func (s *Service) checkTimeout(f *fieldErrors, field string, d *durationpb.Duration, required bool) time.Duration {
	if d == nil {
		if required {
			f.add(field, "required")
		}
		return 0
	}
	if err := d.CheckValid(); err != nil {
		f.add(field, "%v", err)
		return 0
	}
	t := d.AsDuration()
	switch {
	case t <= 0:
		f.add(field, "must be positive, got %s", t)
	case t > s.cfg.MaxTimeout:
		f.add(field, "%s is longer than this host's maximum of %s", t, s.cfg.MaxTimeout)
	}
	return t
}

// resources applies the defaults to r and checks it.
func (s *Service) resources(f *fieldErrors, r *pb.Resources) (cpuMilli, memoryMiB, diskMiB int64) {
	cpuMilli, memoryMiB, diskMiB = s.cfg.DefaultCPUMilli, s.cfg.DefaultMemoryMiB, s.cfg.DefaultDiskMiB
	if r == nil {
		return cpuMilli, memoryMiB, diskMiB
	}
	switch {
	case r.GetCpuMilli() < 0:
		f.add("resources.cpu_milli", "must not be negative, got %d", r.GetCpuMilli())
	case r.GetCpuMilli() > 0 && r.GetCpuMilli() < MinCPUMilli:
		f.add("resources.cpu_milli", "must be at least %d, got %d", MinCPUMilli, r.GetCpuMilli())
	case r.GetCpuMilli() > 0:
		cpuMilli = r.GetCpuMilli()
	}
	switch {
	case r.GetMemoryMib() < 0:
		f.add("resources.memory_mib", "must not be negative, got %d", r.GetMemoryMib())
	case r.GetMemoryMib() > 0 && r.GetMemoryMib() < MinMemoryMiB:
		f.add("resources.memory_mib", "must be at least %d, got %d", MinMemoryMiB, r.GetMemoryMib())
	case r.GetMemoryMib() > 0:
		memoryMiB = r.GetMemoryMib()
	}
	switch {
	case r.GetDiskMib() < 0 || r.GetDiskMib() > MaxDiskMiB:
		f.add("resources.disk_mib", "must be between 0 and %d, got %d", MaxDiskMiB, r.GetDiskMib())
	case r.GetDiskMib() > 0:
		diskMiB = r.GetDiskMib()
	}
	return cpuMilli, memoryMiB, diskMiB
}

func checkMetadata(f *fieldErrors, m map[string]string) {
	if len(m) > maxMetadataEntries {
		f.add("metadata", "at most %d entries, got %d", maxMetadataEntries, len(m))
	}
	total := 0
	for k, v := range m {
		if k == "" {
			f.add("metadata", "keys must not be empty")
		}
		if len(k) > maxMetadataKeyBytes {
			f.add("metadata", "key %q is longer than %d bytes", truncate(k), maxMetadataKeyBytes)
		}
		total += len(k) + len(v)
	}
	if total > maxMetadataBytes {
		f.add("metadata", "keys and values take %d bytes, more than %d", total, maxMetadataBytes)
	}
}

func checkEnvVars(f *fieldErrors, m map[string]string) {
	if len(m) > maxEnvVars {
		f.add("env_vars", "at most %d variables, got %d", maxEnvVars, len(m))
	}
	total := 0
	for k, v := range m {
		if !envNameRE.MatchString(k) {
			f.add("env_vars", "%q is not a variable name ([A-Za-z_][A-Za-z0-9_]*)", truncate(k))
		}
		if strings.ContainsRune(v, 0) {
			f.add("env_vars", "the value of %s contains a NUL byte", truncate(k))
		}
		total += len(k) + len(v)
	}
	if total > maxEnvBytes {
		f.add("env_vars", "names and values take %d bytes, more than %d", total, maxEnvBytes)
	}
}

func checkTeam(f *fieldErrors, team string) {
	if team != "" && (len(team) > maxTeamLen || !teamRE.MatchString(team)) {
		f.add("team", "%q is not a namespace name (a DNS label of at most %d characters)", truncate(team), maxTeamLen)
	}
}

func checkPool(f *fieldErrors, pool string) {
	if pool != "" && (len(pool) > maxPoolLen || !poolRE.MatchString(pool)) {
		f.add("pool", "%q is not namespace/name", truncate(pool))
	}
}

func checkID(f *fieldErrors, id string) {
	if !sandboxid.Valid(id) {
		f.add("sandbox_id", "%q is not a sandbox ID (%d characters of [a-z0-9])", truncate(id), sandboxid.Len)
	}
}

// truncate keeps an echoed value short.
func truncate(s string) string {
	if len(s) > 70 {
		return s[:70] + "…"
	}
	return s
}
