// Package store is sandboxd's memory across its own restarts: one record per
// sandbox, each a JSON file under the state directory written atomically
// (temporary file, rename). A sandboxd killed at any instant leaves every
// record either as it was or as it became, never half-written, so a restart
// can re-adopt every sandbox.
//
// Surviving a power loss or a kernel crash is another matter: that needs an
// fsync of the file and of the directory, which costs more than a millisecond
// on the build machines — most of a warm claim. A record is fsynced when the
// store's sync policy says so (SetSync; by default always). sandboxd asks it
// only for what could outlive the host's uptime: a running sandbox's
// processes die with the host, so its record is as good as gone too.
package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/skiff-dev/skiff/shared/sandboxid"
)

// SchemaVersion is the newest record schema this sandboxd reads; Load
// refuses newer ones rather than misread them. A record is written with the
// oldest schema that holds it (schemaOf), so an older sandboxd still reads
// every record it would not misread.
const SchemaVersion = 2

// schemaOf is the schema a record is written with: 2 when it holds a
// traffic access token, which a sandboxd that knows only schema 1 would
// ignore, serving the sandbox's ports to anyone; 1 otherwise.
func schemaOf(r *Record) int {
	if r.TrafficAccessToken != "" {
		return 2
	}
	return 1
}

// ErrNotFound is returned for a record that does not exist.
var ErrNotFound = errors.New("sandbox record not found")

// Record is what sandboxd must remember about a sandbox to re-adopt it.
type Record struct {
	Schema              int               `json:"schema"`
	ID                  string            `json:"id"`
	Template            string            `json:"template"`
	TemplateVersion     string            `json:"templateVersion,omitempty"`
	State               string            `json:"state"`
	Pool                string            `json:"pool,omitempty"`
	Team                string            `json:"team,omitempty"`
	Metadata            map[string]string `json:"metadata,omitempty"`
	StartedAt           time.Time         `json:"startedAt"`
	EndAt               time.Time         `json:"endAt,omitzero"`
	CPUMilli            int64             `json:"cpuMilli"`
	MemoryMiB           int64             `json:"memoryMiB"`
	DiskMiB             int64             `json:"diskMiB"`
	EnvdAccessToken     string            `json:"envdAccessToken"`
	AutoPause           bool              `json:"autoPause,omitempty"`
	AllowInternetAccess bool              `json:"allowInternetAccess"`
	// AutoResume: a relayed request for the paused sandbox resumes it.
	AutoResume bool `json:"autoResume,omitempty"`
	// TrafficAccessToken, when set, is what a relayed request to a port
	// other than envd's must carry (public traffic is off); empty means
	// public.
	TrafficAccessToken string `json:"trafficAccessToken,omitempty"`
	// Timeout is the lifetime last asked for (create, claim, SetTimeout,
	// Resume with a timeout), in nanoseconds: an auto-resume gives it again.
	Timeout time.Duration `json:"timeout,omitempty"`
	// Runtime names the runtime that runs the sandbox; RuntimeState is that
	// runtime's own handle on it (a pid, cgroup and network paths, …).
	Runtime      string          `json:"runtime"`
	RuntimeState json.RawMessage `json:"runtimeState,omitempty"`
	// Address is the sandbox's own IP address (its /30 from the address
	// pool), claimed again when a restarted sandboxd re-adopts it.
	Address string `json:"address,omitempty"`
	// PausedAt is when the sandbox was paused; EndAt minus PausedAt is the
	// lifetime a resume without a new timeout gives back.
	PausedAt time.Time `json:"pausedAt,omitzero"`
	// EnvdVersion is the version the sandbox's envd reported.
	EnvdVersion string `json:"envdVersion,omitempty"`
}

// Store holds the records under one directory. It is safe for concurrent
// use; writes of one record are serialised.
type Store struct {
	dir  string
	mu   sync.Mutex
	sync func(*Record) bool
}

// SetSync sets which records are written durably (fsync of the file and the
// directory); nil means all of them. Call it before the first Put.
func (s *Store) SetSync(policy func(*Record) bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sync = policy
}

const (
	recordExt  = ".json"
	tempPrefix = ".tmp-"
	corruptDir = "corrupt"
)

// Open opens (creating, mode 0700: records hold access tokens) the store in
// dir and removes the temporary files a crash left behind.
func Open(dir string) (*Store, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create state directory %s: %w", dir, err)
	}
	temps, err := filepath.Glob(filepath.Join(dir, tempPrefix+"*"))
	if err != nil {
		return nil, fmt.Errorf("list temporary files in %s: %w", dir, err)
	}
	for _, t := range temps {
		if err := os.Remove(t); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("remove leftover %s: %w", t, err)
		}
	}
	return &Store{dir: dir}, nil
}

// Put writes r, replacing the record of the same ID, and returns once it is
// durable.
func (s *Store) Put(r *Record) error {
	if err := checkID(r.ID); err != nil {
		return err
	}
	rec := *r
	rec.Schema = schemaOf(r)
	data, err := json.Marshal(&rec)
	if err != nil {
		return fmt.Errorf("encode record %s: %w", r.ID, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.writeAtomic(r.ID+recordExt, data, s.sync == nil || s.sync(r))
}

// Get reads one record.
func (s *Store) Get(id string) (*Record, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	data, err := os.ReadFile(filepath.Join(s.dir, id+recordExt))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	if err != nil {
		return nil, fmt.Errorf("read record %s: %w", id, err)
	}
	return decode(id, data)
}

// Delete removes a record; removing one that does not exist is not an error.
func (s *Store) Delete(id string) error {
	if err := checkID(id); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := os.Remove(filepath.Join(s.dir, id+recordExt)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("delete record %s: %w", id, err)
	}
	return syncDir(s.dir)
}

// Load reads every record, sorted by ID. A record that cannot be read
// (damaged on disk, or written by a newer sandboxd) is moved aside into the
// corrupt/ folder and reported in the joined error, while the others load:
// one bad file must not cost every other sandbox.
func (s *Store) Load() ([]*Record, error) {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, fmt.Errorf("read state directory %s: %w", s.dir, err)
	}
	var out []*Record
	var errs []error
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, recordExt) || strings.HasPrefix(name, tempPrefix) {
			continue
		}
		id := strings.TrimSuffix(name, recordExt)
		data, err := os.ReadFile(filepath.Join(s.dir, name))
		if err != nil {
			errs = append(errs, fmt.Errorf("read record %s: %w", id, err))
			continue
		}
		r, err := decode(id, data)
		if err != nil {
			errs = append(errs, s.quarantine(name, err))
			continue
		}
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b *Record) int { return strings.Compare(a.ID, b.ID) })
	return out, errors.Join(errs...)
}

func decode(id string, data []byte) (*Record, error) {
	var r Record
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("decode record %s: %w", id, err)
	}
	switch {
	case r.Schema > SchemaVersion:
		return nil, fmt.Errorf("record %s has schema %d, newer than this sandboxd's %d", id, r.Schema, SchemaVersion)
	case r.ID != id:
		return nil, fmt.Errorf("record file %s holds sandbox %q", id, r.ID)
	}
	return &r, nil
}

// quarantine moves a record that cannot be read into corrupt/ and returns
// the error that says so.
func (s *Store) quarantine(name string, cause error) error {
	dir := filepath.Join(s.dir, corruptDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return errors.Join(cause, fmt.Errorf("create %s: %w", dir, err))
	}
	dest := filepath.Join(dir, name+"."+time.Now().UTC().Format("20060102T150405.000000000"))
	if err := os.Rename(filepath.Join(s.dir, name), dest); err != nil {
		return errors.Join(cause, fmt.Errorf("move %s aside: %w", name, err))
	}
	return fmt.Errorf("%w (moved to %s)", cause, dest)
}

// writeAtomic replaces dir/name with data: a temporary file in the same
// directory, fsync, rename over the name, fsync of the directory.
func (s *Store) writeAtomic(name string, data []byte, durable bool) error {
	f, err := os.CreateTemp(s.dir, tempPrefix+name+"-*")
	if err != nil {
		return fmt.Errorf("create temporary record: %w", err)
	}
	tmp := f.Name()
	ok := false
	defer func() {
		if !ok {
			_ = f.Close()
			_ = os.Remove(tmp)
		}
	}()
	if _, err := f.Write(data); err != nil {
		return fmt.Errorf("write %s: %w", tmp, err)
	}
	if durable {
		if err := f.Sync(); err != nil {
			return fmt.Errorf("sync %s: %w", tmp, err)
		}
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, filepath.Join(s.dir, name)); err != nil {
		return fmt.Errorf("rename %s: %w", tmp, err)
	}
	ok = true
	if !durable {
		return nil
	}
	return syncDir(s.dir)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("open %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}

// checkID refuses anything but a sandbox ID (20 characters of [a-z0-9]), so
// an ID can neither escape the directory nor collide with its own files.
func checkID(id string) error {
	if _, err := sandboxid.Parse(id); err != nil {
		return fmt.Errorf("record: %w", err)
	}
	return nil
}
