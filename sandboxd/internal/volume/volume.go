// Package volume keeps a host's volumes (e2b's volumes): a team's named
// files that outlive its sandboxes, mounted read-write by any number of
// them at once, and read and written without one through e2b's volume
// content API (content.go).
//
// A store is a directory, the state directory's own or a filesystem shared
// by hosts (NFS, CephFS, a CSI volume: Options.Shared):
//
//	<dir>/records/<id>.json        one volume: team, name, size, when made
//	<dir>/names/<team>/<name>      the ID of the team's volume of that name
//	<dir>/data/<id>/               a directory volume's files
//	<dir>/images/<id>.img          an image volume's filesystem (below)
//	<dir>/leases/<id>/<node>~<sb>  a sandbox of a node that mounts it
//	<dir>/store-id                 a shared store's ID, the same on each host
//
// A volume with a size (Options.SizeMiB, on a store of one host) is an ext4
// image of that size (package diskimage), with a journal, mounted at
// <mount-dir>/<id> on first use and its files in its data/ directory: its
// size is enforced as a sandbox's disk is (ENOSPC), and what it uses is one
// statfs away. A volume without a size, and every volume of a shared store
// (an image must not be mounted by two hosts), is a plain directory, as big
// as its filesystem lets it be.
//
// A name belongs to a volume when names/<team>/<name> holds its ID: that
// file is made with O_EXCL after the record, so of two creates of one name
// (two hosts of a shared store included) one wins, and a record whose name
// file names another ID (a create that crashed or lost) is no volume and is
// removed by Open. Every write is made durable before the call returns.
//
// A sandbox that mounts a volume holds a lease on it, made when it starts
// or resumes and removed when it ends; a volume is not deleted while a
// lease of a live sandbox stands (Delete).
package volume

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/skiff-dev/skiff/sandboxd/internal/diskimage"
	"github.com/skiff-dev/skiff/sandboxd/internal/sandboxrt"
)

// SchemaVersion is the newest record schema this sandboxd reads.
const SchemaVersion = 1

var (
	// ErrNotFound is a volume the team does not have.
	ErrNotFound = errors.New("volume not found")
	// ErrExists is a name the team has a volume by already.
	ErrExists = errors.New("volume name taken")
	// ErrInUse is a volume a live sandbox mounts.
	ErrInUse = errors.New("volume in use")
	// ErrInvalid is a bad name, team or ID.
	ErrInvalid = errors.New("invalid volume")
)

// MaxNameBytes bounds a name (e2b keeps them in a VARCHAR(250)).
const MaxNameBytes = 250

var (
	nameRE = regexp.MustCompile(`^[a-zA-Z0-9_-]+$`)
	teamRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)
	idRE   = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
)

// ValidName reports whether name is a volume name: e2b's ^[a-zA-Z0-9_-]+$,
// at most MaxNameBytes.
func ValidName(name string) bool { return len(name) <= MaxNameBytes && nameRE.MatchString(name) }

// ValidID reports whether id is a volume ID: a UUID in lowercase.
func ValidID(id string) bool { return idRE.MatchString(id) }

// Volume is one volume's record.
type Volume struct {
	Schema    int       `json:"schema"`
	ID        string    `json:"id"`
	Team      string    `json:"team"`
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"createdAt"`
	// SizeMiB is its image's size; 0: a directory, unlimited.
	SizeMiB int64 `json:"sizeMiB,omitempty"`
}

// Options configure a store.
type Options struct {
	// Dir is the store.
	Dir string
	// MountDir is where this host mounts image volumes.
	MountDir string
	// Node is this host's name, on its leases.
	Node string
	// SizeMiB is the size of each new volume: an ext4 image of that size;
	// 0 makes directories, unlimited. It must be 0 with Shared.
	SizeMiB int64
	// Shared says Dir is shared by hosts.
	Shared bool
	// Log gets what the store keeps despite an error; nil: slog's default.
	Log *slog.Logger
}

// imageFormat is a volume's ext4: with a journal (a volume outlives host
// crashes), without blocks reserved for root; mounted with discard, which
// gives deleted blocks back to the host.
var imageFormat = diskimage.Format{
	Name:      "vol1",
	MkfsArgs:  []string{"-q", "-F", "-m", "0", "-E", "lazy_itable_init=1,nodiscard"},
	MountData: "discard",
}

// Store is a host's volume store. It is safe for concurrent use.
type Store struct {
	opts    Options
	storeID string
	golden  *diskimage.Golden

	mu    sync.Mutex
	locks map[string]*sync.Mutex // per volume ID
}

// Dir is the store's directory (Options.Dir).
func (s *Store) Dir() string { return s.opts.Dir }

// Open opens (making it if needed) the store opts names, and removes what
// crashed creates and deletes left: records without their name, and
// temporary files. On a shared store only what is an hour old goes, since
// another host may be in the middle of a create.
func Open(opts Options) (*Store, error) {
	if opts.Shared && opts.SizeMiB > 0 {
		return nil, errors.New("volumes of a shared store are directories: their size cannot be limited here (the shared filesystem's quotas do that)")
	}
	if opts.SizeMiB > 0 && opts.SizeMiB < diskimage.MinMiB {
		return nil, fmt.Errorf("a volume's size is at least %d MiB", diskimage.MinMiB)
	}
	for _, d := range []string{"records", "names", "data", "images", "leases"} {
		if err := os.MkdirAll(filepath.Join(opts.Dir, d), 0o700); err != nil {
			return nil, fmt.Errorf("volume store: %w", err)
		}
	}
	if err := os.MkdirAll(opts.MountDir, 0o700); err != nil {
		return nil, fmt.Errorf("volume store: %w", err)
	}
	s := &Store{opts: opts, locks: map[string]*sync.Mutex{},
		golden: &diskimage.Golden{Dir: filepath.Join(opts.Dir, "golden"), Format: imageFormat}}
	if opts.Shared {
		id, err := storeID(opts.Dir)
		if err != nil {
			return nil, fmt.Errorf("volume store: %w", err)
		}
		s.storeID = id
	}
	if err := s.gc(); err != nil {
		return nil, fmt.Errorf("volume store: %w", err)
	}
	return s, nil
}

// storeID reads the shared store's ID, making it when there is none yet
// (the first host to get there wins).
func storeID(dir string) (string, error) {
	path := filepath.Join(dir, "store-id")
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	id := hex.EncodeToString(b)
	if err := writeExclusive(path, filepath.Join(dir, "records"), []byte(id+"\n")); err != nil && !errors.Is(err, fs.ErrExist) {
		return "", err
	}
	got, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	if s := strings.TrimSpace(string(got)); s != "" {
		return s, nil
	}
	return "", fmt.Errorf("%s is empty", path)
}

// SharedID is the shared store's ID; empty for a store of one host.
func (s *Store) SharedID() string { return s.storeID }

// SizeMiB is the size new volumes get; 0: unlimited.
func (s *Store) SizeMiB() int64 { return s.opts.SizeMiB }

func (s *Store) lock(id string) func() {
	s.mu.Lock()
	l := s.locks[id]
	if l == nil {
		l = &sync.Mutex{}
		s.locks[id] = l
	}
	s.mu.Unlock()
	l.Lock()
	return l.Unlock
}

func (s *Store) recordPath(id string) string { return filepath.Join(s.opts.Dir, "records", id+".json") }
func (s *Store) namePath(team, name string) string {
	return filepath.Join(s.opts.Dir, "names", team, name)
}
func (s *Store) imagePath(id string) string { return filepath.Join(s.opts.Dir, "images", id+".img") }
func (s *Store) mountPath(id string) string { return filepath.Join(s.opts.MountDir, id) }
func (s *Store) leaseDir(id string) string  { return filepath.Join(s.opts.Dir, "leases", id) }

// dataPath is where v's files are (an image volume's once mounted).
func (s *Store) dataPath(v *Volume) string {
	if v.SizeMiB > 0 {
		return filepath.Join(s.mountPath(v.ID), "data")
	}
	return filepath.Join(s.opts.Dir, "data", v.ID)
}

func checkTeam(team string) error {
	if !teamRE.MatchString(team) {
		return fmt.Errorf("%w: team %q is not a namespace name", ErrInvalid, team)
	}
	return nil
}

// Create makes team's empty volume name. Its root is writable by every
// user of a sandbox that mounts it (mode 0777), as e2b's.
func (s *Store) Create(team, name string) (*Volume, error) {
	if err := checkTeam(team); err != nil {
		return nil, err
	}
	if !ValidName(name) {
		return nil, fmt.Errorf("%w: name %q: letters, digits, '_' and '-', at most %d bytes", ErrInvalid, name, MaxNameBytes)
	}
	if id, err := s.nameOwner(team, name); err == nil && s.exists(id) {
		return nil, fmt.Errorf("%w: %s", ErrExists, name)
	}
	v := &Volume{Schema: SchemaVersion, ID: newUUID(), Team: team, Name: name, CreatedAt: time.Now().UTC().Truncate(time.Millisecond), SizeMiB: s.opts.SizeMiB}
	defer s.lock(v.ID)()
	undo := func() { _ = s.removeFiles(v) }
	if v.SizeMiB > 0 {
		if err := s.golden.Make(s.imagePath(v.ID), v.SizeMiB); err != nil {
			return nil, err
		}
		if err := s.mount(v); err != nil {
			undo()
			return nil, err
		}
	}
	data := s.dataPath(v)
	if err := os.Mkdir(data, 0o777); err != nil {
		undo()
		return nil, fmt.Errorf("make volume %s: %w", name, err)
	}
	if err := os.Chmod(data, 0o777); err != nil { // past the umask
		undo()
		return nil, err
	}
	b, err := json.Marshal(v)
	if err != nil {
		undo()
		return nil, err
	}
	if err := writeDurable(s.recordPath(v.ID), b); err != nil {
		undo()
		return nil, fmt.Errorf("write volume record: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(s.namePath(team, name)), 0o700); err != nil {
		undo()
		return nil, err
	}
	if err := writeExclusive(s.namePath(team, name), filepath.Join(s.opts.Dir, "records"), []byte(v.ID)); err != nil {
		undo()
		if errors.Is(err, fs.ErrExist) {
			if s.reclaimName(team, name) {
				return s.Create(team, name)
			}
			return nil, fmt.Errorf("%w: %s", ErrExists, name)
		}
		return nil, fmt.Errorf("claim volume name: %w", err)
	}
	return v, nil
}

// reclaimName removes team's name when it names no volume: one whose
// record is gone (a delete that crashed), or nothing (an empty name, left
// by an older sandboxd that crashed between making the file and writing
// it). It reports whether it did, for the caller to try its create again.
// Two creates of this sandboxd that find the name stale at once reclaim it
// one at a time: the second finds the first's new volume there and leaves
// it. (Hosts of a shared store have no lock between them here.)
func (s *Store) reclaimName(team, name string) bool {
	defer s.lock("name/" + team + "/" + name)()
	id, err := s.nameOwner(team, name)
	if err != nil || (id != "" && s.exists(id)) {
		return false
	}
	return os.Remove(s.namePath(team, name)) == nil
}

// exists reports whether volume id has a record.
func (s *Store) exists(id string) bool {
	_, err := os.Stat(s.recordPath(id))
	return err == nil
}

// nameOwner is the ID names/<team>/<name> holds.
func (s *Store) nameOwner(team, name string) (string, error) {
	b, err := os.ReadFile(s.namePath(team, name))
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

// read reads volume id's record, which must own its name.
func (s *Store) read(id string) (*Volume, error) {
	if !ValidID(id) {
		return nil, ErrNotFound
	}
	b, err := os.ReadFile(s.recordPath(id))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, err
	}
	var v Volume
	if err := json.Unmarshal(b, &v); err != nil {
		return nil, fmt.Errorf("volume record %s: %w", id, err)
	}
	if v.Schema > SchemaVersion {
		return nil, fmt.Errorf("volume record %s has schema %d; this sandboxd reads up to %d", id, v.Schema, SchemaVersion)
	}
	if owner, err := s.nameOwner(v.Team, v.Name); err != nil || owner != v.ID {
		return nil, ErrNotFound
	}
	return &v, nil
}

// Get returns team's volume by ID, or by name when id is empty.
func (s *Store) Get(team, id, name string) (*Volume, error) {
	if id == "" {
		if !ValidName(name) || checkTeam(team) != nil {
			return nil, ErrNotFound
		}
		var err error
		if id, err = s.nameOwner(team, name); err != nil {
			return nil, ErrNotFound
		}
	}
	v, err := s.read(id)
	if err != nil {
		return nil, err
	}
	if v.Team != team {
		return nil, ErrNotFound
	}
	return v, nil
}

// List returns team's volumes (every team's for ""), by name then ID.
func (s *Store) List(team string) ([]*Volume, error) {
	entries, err := os.ReadDir(filepath.Join(s.opts.Dir, "records"))
	if err != nil {
		return nil, err
	}
	var out []*Volume
	for _, e := range entries {
		id, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || !ValidID(id) {
			continue
		}
		v, err := s.read(id)
		if err != nil {
			continue // gone since, or not a volume (yet)
		}
		if team == "" || v.Team == team {
			out = append(out, v)
		}
	}
	slices.SortFunc(out, func(a, b *Volume) int {
		if c := strings.Compare(a.Name, b.Name); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	return out, nil
}

// Root returns the host directory of v's files, mounting its image first
// if it is not mounted (after a reboot).
func (s *Store) Root(v *Volume) (string, error) {
	if v.SizeMiB > 0 {
		defer s.lock(v.ID)()
		if !s.exists(v.ID) {
			return "", ErrNotFound
		}
		if !sandboxrt.IsMountPoint(s.mountPath(v.ID)) {
			if err := s.mount(v); err != nil {
				return "", err
			}
		}
	}
	return s.dataPath(v), nil
}

// mount mounts v's image at its mount point.
func (s *Store) mount(v *Volume) error {
	mnt := s.mountPath(v.ID)
	if err := os.MkdirAll(mnt, 0o700); err != nil {
		return err
	}
	if err := diskimage.MountKept(s.imagePath(v.ID), mnt, imageFormat.MountData); err != nil {
		return fmt.Errorf("mount volume %s: %w", v.Name, err)
	}
	return nil
}

// Used is the space v's files take, in bytes: an image's as df says it, a
// directory's by walking it; -1 when it cannot be told, or the walk did not
// end before ctx.
func (s *Store) Used(ctx context.Context, v *Volume) int64 {
	root, err := s.Root(v)
	if err != nil {
		return -1
	}
	if v.SizeMiB > 0 {
		return diskimage.Used(s.mountPath(v.ID))
	}
	var total int64
	err = filepath.WalkDir(root, func(_ string, d fs.DirEntry, err error) error {
		if cerr := ctx.Err(); cerr != nil {
			return cerr // too many files to count in time: unknown
		}
		if err != nil {
			return nil //nolint:nilerr // a file gone while walking counts nothing
		}
		if info, err := d.Info(); err == nil {
			// What it takes on disk, but at least its length (a
			// filesystem may keep a small file inside its inode).
			n := info.Size()
			if st, ok := info.Sys().(*unix.Stat_t); ok {
				n = max(n, st.Blocks*512)
			}
			total += n
		}
		return nil
	})
	if err != nil {
		return -1
	}
	return total
}

// Lease is a sandbox's hold on a volume it mounts.
type Lease struct {
	Node, Sandbox string
}

func (s *Store) leasePath(id string, l Lease) string {
	return filepath.Join(s.leaseDir(id), l.Node+"~"+l.Sandbox)
}

// Hold records that sandbox of this host mounts v.
func (s *Store) Hold(v *Volume, sandbox string) error {
	defer s.lock(v.ID)()
	if !s.exists(v.ID) {
		return ErrNotFound
	}
	if err := os.MkdirAll(s.leaseDir(v.ID), 0o700); err != nil {
		return err
	}
	if err := writeDurable(s.leasePath(v.ID, Lease{s.opts.Node, sandbox}), nil); err != nil {
		return fmt.Errorf("hold volume %s: %w", v.Name, err)
	}
	return nil
}

// Release removes sandbox's lease on volume id, if it has one.
func (s *Store) Release(id, sandbox string) error {
	err := os.Remove(s.leasePath(id, Lease{s.opts.Node, sandbox}))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return err
}

// Leases lists the leases on volume id.
func (s *Store) Leases(id string) ([]Lease, error) {
	entries, err := os.ReadDir(s.leaseDir(id))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []Lease
	for _, e := range entries {
		if node, sb, ok := strings.Cut(e.Name(), "~"); ok {
			out = append(out, Lease{node, sb})
		}
	}
	return out, nil
}

// OwnLeases lists this host's leases on every volume, by volume ID.
func (s *Store) OwnLeases() (map[string][]string, error) {
	dirs, err := os.ReadDir(filepath.Join(s.opts.Dir, "leases"))
	if err != nil {
		return nil, err
	}
	out := map[string][]string{}
	for _, d := range dirs {
		ls, err := s.Leases(d.Name())
		if err != nil {
			return nil, err
		}
		for _, l := range ls {
			if l.Node == s.opts.Node {
				out[d.Name()] = append(out[d.Name()], l.Sandbox)
			}
		}
	}
	return out, nil
}

// Delete removes team's volume id and its files, unless live says one of
// its leases is of a live sandbox (ErrInUse); the others are stale and go
// with it.
func (s *Store) Delete(team, id string, live func(Lease) bool) error {
	v, err := s.Get(team, id, "")
	if err != nil {
		return err
	}
	defer s.lock(v.ID)()
	return s.deleteLocked(v, live)
}

// deleteLocked is Delete of v, found before its lock was taken.
func (s *Store) deleteLocked(v *Volume, live func(Lease) bool) error {
	// Another delete of it may have come first (it held the lock), and
	// a new volume taken the name since: read again, v no longer owns its
	// name (ErrNotFound), and that one's name stays.
	if _, err := s.read(v.ID); err != nil {
		return err
	}
	ls, err := s.Leases(v.ID)
	if err != nil {
		return err
	}
	var holders []string
	for _, l := range ls {
		if live(l) {
			holders = append(holders, l.Sandbox)
		}
	}
	if len(holders) > 0 {
		return fmt.Errorf("%w: mounted by sandbox %s", ErrInUse, strings.Join(holders, ", "))
	}
	// The name first: from then on the volume is gone to every reader.
	if err := os.Remove(s.namePath(v.Team, v.Name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err := syncDir(filepath.Dir(s.namePath(v.Team, v.Name))); err != nil {
		return err
	}
	return s.removeFiles(v)
}

// removeFiles removes everything of v but its name.
func (s *Store) removeFiles(v *Volume) error {
	var errs []error
	if v.SizeMiB > 0 {
		mnt := s.mountPath(v.ID)
		if sandboxrt.IsMountPoint(mnt) {
			if err := unix.Unmount(mnt, unix.MNT_DETACH); err != nil {
				errs = append(errs, fmt.Errorf("unmount volume %s: %w", v.Name, err))
			}
		}
		errs = append(errs, removeIfThere(mnt), removeIfThere(s.imagePath(v.ID)))
	} else {
		errs = append(errs, os.RemoveAll(s.dataPath(v)))
	}
	errs = append(errs, os.RemoveAll(s.leaseDir(v.ID)), removeIfThere(s.recordPath(v.ID)))
	return errors.Join(errs...)
}

// gc removes records that own no name and temporary files (on a shared
// store, those an hour old).
func (s *Store) gc() error {
	dir := filepath.Join(s.opts.Dir, "records")
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		info, err := e.Info()
		if err != nil || (s.opts.Shared && time.Since(info.ModTime()) < time.Hour) {
			continue
		}
		if strings.HasPrefix(e.Name(), ".tmp-") {
			_ = os.Remove(filepath.Join(dir, e.Name()))
			continue
		}
		id, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || !ValidID(id) {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			continue
		}
		var v Volume
		if json.Unmarshal(b, &v) != nil || v.Schema > SchemaVersion {
			continue // not ours to judge
		}
		// Only a name that is gone, or another volume's, makes the record
		// a leftover: any other error reading it (EIO, ESTALE on a shared
		// filesystem) says nothing, and the volume stays.
		owner, err := s.nameOwner(v.Team, v.Name)
		switch {
		case err == nil && owner == v.ID:
			continue
		case err != nil && !errors.Is(err, fs.ErrNotExist):
			cmp.Or(s.opts.Log, slog.Default()).Warn("cannot read a volume's name; keeping it", "volume", v.ID, "error", err)
			continue
		}
		if err := s.removeFiles(&v); err != nil {
			return fmt.Errorf("remove what a crashed create or delete left of volume %s: %w", v.ID, err)
		}
	}
	return s.sweepFiles()
}

// sweepFiles removes the files of creates cut short before their record
// was written: an image (and its mount) or a data folder whose volume has
// no record. On a shared store, only those an hour old (another host may
// be making one now).
func (s *Store) sweepFiles() error {
	for _, kind := range []struct{ dir, suffix string }{{"images", ".img"}, {"data", ""}} {
		entries, err := os.ReadDir(filepath.Join(s.opts.Dir, kind.dir))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		for _, e := range entries {
			id, ok := strings.CutSuffix(e.Name(), kind.suffix)
			if !ok || !ValidID(id) || s.exists(id) {
				continue
			}
			if info, err := e.Info(); err != nil || (s.opts.Shared && time.Since(info.ModTime()) < time.Hour) {
				continue
			}
			if kind.suffix != "" {
				mnt := s.mountPath(id)
				if sandboxrt.IsMountPoint(mnt) {
					if err := unix.Unmount(mnt, unix.MNT_DETACH); err != nil {
						return fmt.Errorf("unmount what a crashed create left of volume %s: %w", id, err)
					}
				}
				if err := removeIfThere(mnt); err != nil {
					return err
				}
			}
			if err := os.RemoveAll(filepath.Join(s.opts.Dir, kind.dir, e.Name())); err != nil {
				return fmt.Errorf("remove what a crashed create left of volume %s: %w", id, err)
			}
		}
	}
	return nil
}

func removeIfThere(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// newUUID is a random (version 4) UUID.
func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// writeDurable writes b to path through a synced temporary file renamed
// over it, and syncs the directory.
func writeDurable(path string, b []byte) error {
	dir := filepath.Dir(path)
	tmp, err := syncedTemp(dir, b)
	if err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	return syncDir(dir)
}

// writeExclusive makes path with b, failing with fs.ErrExist when it is
// there, and syncs it and its directory. The file is whole or absent, even
// across a crash: b is written and synced to a temporary file in tmpDir
// (on path's filesystem, where gc removes leftovers), which is then linked
// at path, and a link fails when path is there.
func writeExclusive(path, tmpDir string, b []byte) error {
	tmp, err := syncedTemp(tmpDir, b)
	if err != nil {
		return err
	}
	defer os.Remove(tmp)
	if err := os.Link(tmp, path); err != nil {
		return err
	}
	return syncDir(filepath.Dir(path))
}

// syncedTemp writes b to a new temporary file in dir (".tmp-…"), synced
// and closed, and returns its path; on failure nothing of it is left.
func syncedTemp(dir string, b []byte) (string, error) {
	f, err := os.CreateTemp(dir, ".tmp-")
	if err != nil {
		return "", err
	}
	if err := writeSynced(f, b); err != nil {
		_ = os.Remove(f.Name())
		return "", err
	}
	return f.Name(), nil
}

// writeSynced writes b to f, syncs and closes it.
func writeSynced(f *os.File, b []byte) error {
	_, err := f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
