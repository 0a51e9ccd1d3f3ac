// Package store is sandboxd's memory across its own restarts: one record per
// sandbox, a JSON file under the state directory. A change never rewrites a
// file: it writes the record whole into a new file, <id>.<n>.json with n
// above every number used before, and only then removes the file it
// replaces. A sandboxd killed at any instant therefore leaves each record as
// it was or as it became, never half-written: Load takes, of a sandbox's
// files, the newest that reads whole and removes the others.
//
// Why not a temporary file renamed over the old one: on ext4 a rename that
// replaces a file starts the writeback of the new one's data
// (auto_da_alloc), which took 0.38 ms a write on the build machines, most
// of a warm claim; creating a new file and unlinking the old takes 0.06 ms.
//
// Surviving a power loss or a kernel crash is another matter: that needs an
// fsync of the file and of the directory, which costs more than a millisecond
// on the build machines. A record is fsynced when the store's sync policy
// says so (SetSync; by default always). sandboxd asks it only for what could
// outlive the host's uptime: a running sandbox's processes die with the
// host, so its record is as good as gone too. Likewise a deletion is made
// durable only for a record that may have been: one found on disk at Open,
// or written durably since.
package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
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

// VolumeMount is a volume (package volume) mounted at Path.
type VolumeMount struct {
	ID   string `json:"id"`
	Name string `json:"name"`
	Path string `json:"path"`
}

// Egress is a sandbox's outbound rules as given (shared/egress).
type Egress struct {
	AllowOut []string `json:"allowOut,omitempty"`
	DenyOut  []string `json:"denyOut,omitempty"`
}

// Record is what sandboxd must remember about a sandbox to re-adopt it.
type Record struct {
	Schema          int               `json:"schema"`
	ID              string            `json:"id"`
	Template        string            `json:"template"`
	TemplateVersion string            `json:"templateVersion,omitempty"`
	State           string            `json:"state"`
	Pool            string            `json:"pool,omitempty"`
	Team            string            `json:"team,omitempty"`
	Metadata        map[string]string `json:"metadata,omitempty"`
	StartedAt       time.Time         `json:"startedAt"`
	// RunStart is when it last started running: its create or claim, or
	// its last resume. A lifetime bound counts from it. Zero in records
	// from before it, until the sandbox's next resume: no bound (its last
	// resume is not known, and StartedAt may be long before it).
	RunStart            time.Time `json:"runStart,omitzero"`
	EndAt               time.Time `json:"endAt,omitzero"`
	CPUMilli            int64     `json:"cpuMilli"`
	MemoryMiB           int64     `json:"memoryMiB"`
	DiskMiB             int64     `json:"diskMiB"`
	EnvdAccessToken     string    `json:"envdAccessToken"`
	AutoPause           bool      `json:"autoPause,omitempty"`
	AllowInternetAccess bool      `json:"allowInternetAccess"`
	// Egress is its outbound rules as given (e2b's allowOut and denyOut);
	// nil when it never had any.
	Egress *Egress `json:"egress,omitempty"`
	// MaskRequestHost is e2b's maskRequestHost (see relay.Sandbox).
	MaskRequestHost string `json:"maskRequestHost,omitempty"`
	// VolumeMounts are the team's volumes it mounts.
	VolumeMounts []VolumeMount `json:"volumeMounts,omitempty"`
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
	// Snapshot is the snapshot it was started from, if any, and Layers the
	// snapshot layers its root stacks on its template, topmost first: they
	// stay on the host while it lives (package snapshot).
	Snapshot string   `json:"snapshot,omitempty"`
	Layers   []string `json:"layers,omitempty"`
	// RootfsPath is the template version's root it was started on, below
	// its layers: a snapshot of it stacks on the same one.
	RootfsPath string `json:"rootfs,omitempty"`
	// FilesOnly: paused with its files only (its writable layer is the top
	// of Layers); nothing of it runs and the runtime holds nothing of it.
	FilesOnly bool `json:"filesOnly,omitempty"`
	// Boots counts the times it was booted afresh on its files.
	Boots int `json:"boots,omitempty"`
	// AutoPauseFilesOnly: the deadline's pause keeps the files only.
	AutoPauseFilesOnly bool `json:"autoPauseFilesOnly,omitempty"`
	// EnvVars are the environment given at create or claim, which a boot
	// after a files-only pause gives envd again.
	EnvVars map[string]string `json:"envVars,omitempty"`
}

// Store holds the records under one directory. It is safe for concurrent
// use; writes of one record are serialised.
type Store struct {
	dir  string
	mu   sync.Mutex
	sync func(*Record) bool
	// seq is the number of the newest file written; files maps an ID to
	// its record's newest file.
	seq   uint64
	files map[string]string
	// stable holds the records of which a file may be on stable storage:
	// those found at Open and those written durably since. Deleting one
	// syncs the directory, so that it does not come back after a power
	// loss; deleting any other, which a power loss takes anyway, does not.
	stable map[string]bool
	// syncDir makes the directory's entries durable (a test counts it).
	syncDir func(dir string) error
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
// dir and removes the temporary files an older sandboxd's crash left behind.
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
	s := &Store{dir: dir, files: map[string]string{}, stable: map[string]bool{}, syncDir: syncDir}
	versions, err := s.versions()
	if err != nil {
		return nil, err
	}
	for id, vs := range versions {
		s.files[id] = vs[0].name
		s.stable[id] = true
		s.seq = max(s.seq, vs[0].seq)
	}
	return s, nil
}

// version is one file of a record.
type version struct {
	name string
	seq  uint64
}

// parseName reads a record's file name: <id>.<n>.json, or <id>.json (the
// name before numbered files, number 0).
func parseName(name string) (id string, seq uint64, ok bool) {
	base, ok := strings.CutSuffix(name, recordExt)
	if !ok || strings.HasPrefix(name, tempPrefix) {
		return "", 0, false
	}
	id, n, numbered := strings.Cut(base, ".")
	if !numbered {
		return id, 0, true
	}
	seq, err := strconv.ParseUint(n, 10, 64)
	if err != nil || seq == 0 {
		return "", 0, false
	}
	return id, seq, true
}

// versions lists every record's files, newest first.
func (s *Store) versions() (map[string][]version, error) {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, fmt.Errorf("read state directory %s: %w", s.dir, err)
	}
	out := map[string][]version{}
	for _, e := range entries {
		if e.IsDir() {
			continue
		}
		if id, seq, ok := parseName(e.Name()); ok {
			out[id] = append(out[id], version{e.Name(), seq})
		}
	}
	for _, vs := range out {
		slices.SortFunc(vs, func(a, b version) int { return -cmpUint(a.seq, b.seq) })
	}
	return out, nil
}

func cmpUint(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
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
	durable := s.sync == nil || s.sync(r)
	s.seq++
	name := r.ID + "." + strconv.FormatUint(s.seq, 10) + recordExt
	if err := s.writeNew(name, data, durable); err != nil {
		return err
	}
	old := s.files[r.ID]
	s.files[r.ID] = name
	if old != "" {
		if err := os.Remove(filepath.Join(s.dir, old)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("remove the replaced record %s: %w", old, err)
		}
	}
	if !durable {
		return nil
	}
	s.stable[r.ID] = true
	return s.syncDir(s.dir)
}

// Get reads one record.
func (s *Store) Get(id string) (*Record, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	s.mu.Lock()
	name, ok := s.files[id]
	s.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	data, err := os.ReadFile(filepath.Join(s.dir, name))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	if err != nil {
		return nil, fmt.Errorf("read record %s: %w", id, err)
	}
	return decode(id, data)
}

// Delete removes a record; removing one that does not exist is not an error.
// It returns once the removal is durable, if the record may have been.
func (s *Store) Delete(id string) error {
	if err := checkID(id); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	name, ok := s.files[id]
	if !ok {
		return nil
	}
	if err := os.Remove(filepath.Join(s.dir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("delete record %s: %w", id, err)
	}
	delete(s.files, id)
	if !s.stable[id] {
		return nil
	}
	delete(s.stable, id)
	return s.syncDir(s.dir)
}

// Load reads every record, sorted by ID. Of a record's files it takes the
// newest that reads whole and removes the others: older ones a crash left
// before their removal, and a newer one a kill cut short. A record none of
// whose files can be read (damaged on disk, or written by a newer sandboxd)
// is moved aside into the corrupt/ folder and reported in the joined error,
// while the others load: one bad file must not cost every other sandbox.
func (s *Store) Load() ([]*Record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	versions, err := s.versions()
	if err != nil {
		return nil, err
	}
	var out []*Record
	var errs []error
	for id, vs := range versions {
		var (
			rec  *Record
			bad  []error
			keep string
		)
		for _, v := range vs {
			if rec != nil {
				s.removeStale(v.name, &errs)
				continue
			}
			data, err := os.ReadFile(filepath.Join(s.dir, v.name))
			if err != nil {
				bad = append(bad, fmt.Errorf("read record %s: %w", id, err))
				continue
			}
			r, err := decode(id, data)
			if err != nil {
				bad = append(bad, err)
				continue
			}
			rec, keep = r, v.name
		}
		if rec == nil {
			for i, v := range vs {
				errs = append(errs, s.quarantine(v.name, bad[i]))
			}
			delete(s.files, id)
			continue
		}
		// A newer file that does not read whole is a write a kill cut
		// short: the record is the version before it.
		for _, v := range vs {
			if v.name == keep {
				break
			}
			s.removeStale(v.name, &errs)
		}
		s.files[id] = keep
		out = append(out, rec)
	}
	slices.SortFunc(out, func(a, b *Record) int { return strings.Compare(a.ID, b.ID) })
	return out, errors.Join(errs...)
}

// removeStale removes a file that no longer holds a record's newest version.
func (s *Store) removeStale(name string, errs *[]error) {
	if err := os.Remove(filepath.Join(s.dir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		*errs = append(*errs, fmt.Errorf("remove stale record file %s: %w", name, err))
	}
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

// writeNew writes data into the new file dir/name; durable, it also
// fsyncs it.
func (s *Store) writeNew(name string, data []byte, durable bool) error {
	path := filepath.Join(s.dir, name)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("create record file: %w", err)
	}
	ok := false
	defer func() {
		if !ok {
			_ = f.Close()
			_ = os.Remove(path)
		}
	}()
	if _, err := f.Write(data); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if durable {
		if err := f.Sync(); err != nil {
			return fmt.Errorf("sync %s: %w", path, err)
		}
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close %s: %w", path, err)
	}
	ok = true
	return nil
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
