// Package snapshot keeps a host's snapshots: each one a record and the
// layers it is made of, under the state directory:
//
//	<dir>/layers/<layer>/        one layer (package layer), read-only once in place
//	<dir>/layers/.tmp-<layer>…/  a layer being written (an import: one each)
//	<dir>/images/<image>/        one state image (a runtime's memory and processes)
//	<dir>/images/.tmp-<image>…/  an image being written, or a fork's, never kept
//	<dir>/records/<id>.json      one snapshot: team, name, template, layers, image
//	<dir>/digests/<layer>        a layer's digest (layer.Digest), kept once computed
//	<dir>/digests/image-<image>  an image's
//
// A snapshot is written layer first, then record: the layer is synced
// (syncfs) and renamed into place, then the record is written to a
// temporary file, synced, and renamed over its name, and the directory
// synced. A crash at any point leaves a whole snapshot or none: a layer
// without a record is removed by the next GC, a temporary one at Open.
// Snapshots outlive the host's uptime, so every write is made durable.
//
// Layers are shared: a sandbox started from a snapshot stacks its layers
// (and a snapshot of that sandbox keeps them below its own), so a layer
// stays while any record or running sandbox names it, or the capture or
// pull that puts it in place holds it (until its record is written); GC
// removes the others. An image belongs to its one record (a restore reads
// it whole and keeps nothing of it), and goes with it.
package snapshot

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/skiff-dev/skiff/sandboxd/internal/layer"
	"github.com/skiff-dev/skiff/shared/sandboxid"
)

// SchemaVersion is the newest record schema this sandboxd reads.
const SchemaVersion = 1

// DefaultTag is the tag of a name given without one, as in e2b.
const DefaultTag = "default"

// ErrNotFound is a snapshot the team does not have.
var ErrNotFound = errors.New("snapshot not found")

// Record is one snapshot.
type Record struct {
	Schema int    `json:"schema"`
	ID     string `json:"id"`
	Team   string `json:"team"`
	// Name and Tag are the name given at capture; Name is empty for none.
	Name string `json:"name,omitempty"`
	Tag  string `json:"tag,omitempty"`
	// SourceSandbox is the sandbox it was taken from.
	SourceSandbox   string `json:"sourceSandbox"`
	Template        string `json:"template"`
	TemplateVersion string `json:"templateVersion"`
	// Rootfs is the template version's root on this host, below the layers.
	Rootfs string `json:"rootfs"`
	// Layers are its layer IDs, topmost first.
	Layers    []string  `json:"layers"`
	CreatedAt time.Time `json:"createdAt"`
	SizeBytes int64     `json:"sizeBytes"`
	CPUMilli  int64     `json:"cpuMilli"`
	MemoryMiB int64     `json:"memoryMiB"`
	DiskMiB   int64     `json:"diskMiB"`
	// Image, when set, is the ID of the snapshot's state image: the
	// source's memory and processes, restorable by a runtime of
	// ImageFormat on the template and Layers[1:] (the source's own
	// stack; Layers[0] is the image's private layer as files).
	Image       string `json:"image,omitempty"`
	ImageFormat string `json:"imageFormat,omitempty"`
	// ImageBytes is the image's size on disk, in SizeBytes too.
	ImageBytes int64 `json:"imageBytes,omitempty"`
	// ImageEnvdToken is the access token the image's envd holds, which a
	// restored sandbox's first /init presents.
	ImageEnvdToken string `json:"imageEnvdToken,omitempty"`
	// PulledFrom is the node this host fetched the snapshot from; empty
	// on the host that took it.
	PulledFrom string `json:"pulledFrom,omitempty"`
}

// Store is the host's snapshots. It is safe for concurrent use.
type Store struct {
	dir string

	mu   sync.Mutex
	recs map[string]*Record
	// digesting holds a mutex per digest being computed, so that one
	// tree is read once however many ask.
	digesting sync.Map
}

func (s *Store) layersDir() string  { return filepath.Join(s.dir, "layers") }
func (s *Store) imagesDir() string  { return filepath.Join(s.dir, "images") }
func (s *Store) digestsDir() string { return filepath.Join(s.dir, "digests") }
func (s *Store) recordsDir() string { return filepath.Join(s.dir, "records") }

// Open opens (creating) the store in dir, removes what a crash left half
// written, and reads every record.
func Open(dir string) (*Store, error) {
	s := &Store{dir: dir, recs: map[string]*Record{}}
	for _, d := range []string{s.layersDir(), s.imagesDir(), s.recordsDir(), s.digestsDir()} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("snapshots: %w", err)
		}
	}
	entries, err := os.ReadDir(s.layersDir())
	if err != nil {
		return nil, fmt.Errorf("snapshots: %w", err)
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".tmp-") {
			if err := layer.Remove(filepath.Join(s.layersDir(), e.Name())); err != nil {
				return nil, fmt.Errorf("snapshots: remove a layer a crash left: %w", err)
			}
		}
	}
	entries, err = os.ReadDir(s.imagesDir())
	if err != nil {
		return nil, fmt.Errorf("snapshots: %w", err)
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".tmp-") {
			if err := os.RemoveAll(filepath.Join(s.imagesDir(), e.Name())); err != nil {
				return nil, fmt.Errorf("snapshots: remove an image a crash left: %w", err)
			}
		}
	}
	entries, err = os.ReadDir(s.recordsDir())
	if err != nil {
		return nil, fmt.Errorf("snapshots: %w", err)
	}
	for _, e := range entries {
		name := e.Name()
		path := filepath.Join(s.recordsDir(), name)
		if strings.HasSuffix(name, ".tmp") {
			_ = os.Remove(path)
			continue
		}
		id, ok := strings.CutSuffix(name, ".json")
		if !ok {
			continue
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("snapshots: %w", err)
		}
		var r Record
		if err := json.Unmarshal(data, &r); err != nil {
			return nil, fmt.Errorf("snapshots: record %s: %w", name, err)
		}
		if r.Schema > SchemaVersion {
			return nil, fmt.Errorf("snapshots: record %s has schema %d, newer than this sandboxd reads (%d)", name, r.Schema, SchemaVersion)
		}
		if r.ID != id {
			return nil, fmt.Errorf("snapshots: record %s names snapshot %q", name, r.ID)
		}
		s.recs[id] = &r
	}
	return s, nil
}

// LayerPath is where layer id lives.
func (s *Store) LayerPath(id string) string { return filepath.Join(s.layersDir(), id) }

// NewLayer returns a new layer ID and the temporary directory to write it
// into (which does not exist yet); Commit puts it in place.
func (s *Store) NewLayer() (id, tmp string, err error) {
	id, err = newID()
	if err != nil {
		return "", "", err
	}
	return id, filepath.Join(s.layersDir(), ".tmp-"+id), nil
}

func newID() (string, error) {
	var b [12]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return hex.EncodeToString(b[:]), nil
}

// ImagePath is where image id lives.
func (s *Store) ImagePath(id string) string { return filepath.Join(s.imagesDir(), id) }

// NewImage returns a new image ID and the temporary directory to write it
// into (which does not exist yet); CommitImage puts it in place. An image
// never committed (a fork's) is removed with RemoveTemp, or by the next
// Open.
func (s *Store) NewImage() (id, tmp string, err error) {
	id, err = newID()
	if err != nil {
		return "", "", err
	}
	return id, filepath.Join(s.imagesDir(), ".tmp-"+id), nil
}

// CommitImage makes the image written in tmp durable, puts it in place as
// id, and returns its size.
func (s *Store) CommitImage(id, tmp string) (int64, error) {
	var size int64
	err := filepath.WalkDir(tmp, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		st, err := d.Info()
		if err != nil {
			return err
		}
		size += st.Size()
		return syncFile(path)
	})
	if err != nil {
		return 0, fmt.Errorf("sync image: %w", err)
	}
	if err := syncDir(tmp); err != nil {
		return 0, err
	}
	if err := os.Rename(tmp, s.ImagePath(id)); err != nil {
		return 0, fmt.Errorf("put image in place: %w", err)
	}
	return size, syncDir(s.imagesDir())
}

// RemoveImage removes an image directory, in place or temporary.
func RemoveImage(dir string) error { return os.RemoveAll(dir) }

// CommitLayer makes the layer written in tmp durable and puts it in place
// as id.
func (s *Store) CommitLayer(id, tmp string) error {
	if err := layer.Sync(tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, s.LayerPath(id)); err != nil {
		return fmt.Errorf("put layer in place: %w", err)
	}
	return syncDir(s.layersDir())
}

// Put writes r, durably, replacing a record of the same ID.
func (s *Store) Put(r *Record) error {
	if !sandboxid.Valid(r.ID) {
		return fmt.Errorf("snapshot record: invalid ID %q", r.ID)
	}
	r.Schema = SchemaVersion
	data, err := json.Marshal(r)
	if err != nil {
		return err
	}
	path := filepath.Join(s.recordsDir(), r.ID+".json")
	if err := writeDurable(path, data); err != nil {
		return fmt.Errorf("write snapshot record: %w", err)
	}
	s.mu.Lock()
	c := *r
	s.recs[r.ID] = &c
	s.mu.Unlock()
	return nil
}

// Delete removes the record of id (its layers go at the next GC that finds
// them unused). A missing record is ErrNotFound.
func (s *Store) Delete(id string) error {
	s.mu.Lock()
	_, ok := s.recs[id]
	s.mu.Unlock()
	if !ok {
		return ErrNotFound
	}
	if err := os.Remove(filepath.Join(s.recordsDir(), id+".json")); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("delete snapshot record: %w", err)
	}
	if err := syncDir(s.recordsDir()); err != nil {
		return err
	}
	s.mu.Lock()
	delete(s.recs, id)
	s.mu.Unlock()
	return nil
}

// Find returns the team's snapshot that ref names: its ID, or a name with
// an optional tag ("name" is "name:default"). Another team's snapshot is
// ErrNotFound, like a missing one.
func (s *Store) Find(team, ref string) (*Record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r, ok := s.recs[ref]; ok && r.Team == team {
		c := *r
		return &c, nil
	}
	name, tag := SplitName(ref)
	for _, r := range s.recs {
		if r.Team == team && r.Name != "" && r.Name == name && r.Tag == tag {
			c := *r
			return &c, nil
		}
	}
	return nil, ErrNotFound
}

// Filter selects snapshots in List.
type Filter struct {
	Team string
	// SourceSandbox, when set, keeps those taken from it.
	SourceSandbox string
	// Name, when set, keeps the snapshot with this ID, or with this name
	// (any tag) or name:tag.
	Name string
}

// List returns the snapshots that f selects, newest first.
func (s *Store) List(f Filter) []*Record {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*Record
	name, tag, tagged := f.Name, "", false
	if n, t, ok := strings.Cut(f.Name, ":"); ok {
		name, tag, tagged = n, t, true
	}
	for _, r := range s.recs {
		switch {
		case r.Team != f.Team:
			continue
		case f.SourceSandbox != "" && r.SourceSandbox != f.SourceSandbox:
			continue
		case f.Name != "" && r.ID != name && (r.Name != name || tagged && r.Tag != tag):
			continue
		}
		c := *r
		out = append(out, &c)
	}
	slices.SortFunc(out, func(a, b *Record) int {
		if c := b.CreatedAt.Compare(a.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	return out
}

// GC removes every layer that no record names and inUse does not hold
// (the layers of running sandboxes, and of the captures and pulls under
// way), and every image no record names and inUse does not hold, and
// returns how many layers and images it removed.
func (s *Store) GC(inUse map[string]bool) (int, error) {
	keep := map[string]bool{}
	for id := range inUse {
		keep[id] = true
	}
	images := map[string]bool{}
	for id := range inUse {
		images[id] = true // an image a capture or pull is putting in place
	}
	s.mu.Lock()
	for _, r := range s.recs {
		for _, l := range r.Layers {
			keep[l] = true
		}
		if r.Image != "" {
			images[r.Image] = true
		}
	}
	s.mu.Unlock()
	var errs []error
	n := 0
	sweep := func(dir string, keep map[string]bool, remove func(string) error) {
		entries, err := os.ReadDir(dir)
		if err != nil {
			errs = append(errs, err)
			return
		}
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), ".") || keep[e.Name()] {
				continue
			}
			if err := remove(filepath.Join(dir, e.Name())); err != nil {
				errs = append(errs, err)
				continue
			}
			n++
		}
	}
	sweep(s.layersDir(), keep, func(path string) error {
		_ = os.Remove(filepath.Join(s.digestsDir(), filepath.Base(path)))
		return layer.Remove(path)
	})
	sweep(s.imagesDir(), images, func(path string) error {
		_ = os.Remove(filepath.Join(s.digestsDir(), "image-"+filepath.Base(path)))
		return RemoveImage(path)
	})
	return n, errors.Join(errs...)
}

// HasLayer reports whether layer id is in place.
func (s *Store) HasLayer(id string) bool {
	st, err := os.Stat(s.LayerPath(id))
	return err == nil && st.IsDir()
}

// HasImage reports whether image id is in place.
func (s *Store) HasImage(id string) bool {
	st, err := os.Stat(s.ImagePath(id))
	return err == nil && st.IsDir()
}

// LayerDigest is the digest of layer id (layer.Digest), computed the
// first time and kept.
func (s *Store) LayerDigest(id string) (string, error) {
	return s.digest(id, s.LayerPath(id))
}

// ImageDigest is the digest of image id, as LayerDigest.
func (s *Store) ImageDigest(id string) (string, error) {
	return s.digest("image-"+id, s.ImagePath(id))
}

func (s *Store) digest(key, dir string) (string, error) {
	if !validID(strings.TrimPrefix(key, "image-")) {
		return "", fmt.Errorf("snapshots: no such layer or image %q", key)
	}
	mu, _ := s.digesting.LoadOrStore(key, &sync.Mutex{})
	mu.(*sync.Mutex).Lock()
	defer mu.(*sync.Mutex).Unlock()
	path := filepath.Join(s.digestsDir(), key)
	if b, err := os.ReadFile(path); err == nil && strings.HasPrefix(string(b), "sha256:") {
		return strings.TrimSpace(string(b)), nil
	}
	if _, err := os.Stat(dir); err != nil {
		return "", fmt.Errorf("snapshots: %w", err)
	}
	d, err := layer.Digest(dir)
	if err != nil {
		return "", fmt.Errorf("snapshots: digest of %s: %w", key, err)
	}
	if err := writeDurable(path, []byte(d+"\n")); err != nil {
		return "", fmt.Errorf("snapshots: keep the digest of %s: %w", key, err)
	}
	return d, nil
}

// validID reports a layer or image ID as NewLayer and NewImage make them.
func validID(id string) bool {
	if len(id) != 24 {
		return false
	}
	_, err := hex.DecodeString(id)
	return err == nil
}

// ImportLayer puts layer id in place from r, a tar in layer.WriteTar's
// form whose digest must be want: verified, synced, renamed into place,
// its digest kept. A layer already in place is kept as it is (its bytes
// are the same: its ID names one layer on every host).
func (s *Store) ImportLayer(id, want string, r io.Reader) error {
	if !validID(id) {
		return fmt.Errorf("snapshots: invalid layer ID %q", id)
	}
	if s.HasLayer(id) {
		return nil
	}
	tmp := importTemp(s.layersDir(), id)
	if err := layer.FromVerifiedTar(r, tmp, want); err != nil {
		return fmt.Errorf("layer %s: %w", id, err)
	}
	if err := s.CommitLayer(id, tmp); err != nil {
		_ = layer.Remove(tmp)
		if s.HasLayer(id) { // another import of it won
			return nil
		}
		return err
	}
	return writeDurable(filepath.Join(s.digestsDir(), id), []byte(want+"\n"))
}

// importTemp is a folder in dir, not made yet, that an import of id
// writes before it puts it in place: its own, since two imports of one
// layer run at once (two snapshots of one lineage pulled together), and
// one that shared the other's folder would remove or write into the
// other's tree, which could then be put in place half written under the
// whole's digest. A crash's are removed by Open (".tmp-").
func importTemp(dir, id string) string {
	return filepath.Join(dir, ".tmp-"+id+"-import-"+rand.Text()[:12])
}

// ImportImage puts image id in place from r, as ImportLayer does a layer.
func (s *Store) ImportImage(id, want string, r io.Reader) error {
	if !validID(id) {
		return fmt.Errorf("snapshots: invalid image ID %q", id)
	}
	if s.HasImage(id) {
		return nil
	}
	tmp := importTemp(s.imagesDir(), id)
	if err := layer.FromVerifiedTar(r, tmp, want); err != nil {
		return fmt.Errorf("image %s: %w", id, err)
	}
	if _, err := s.CommitImage(id, tmp); err != nil {
		_ = RemoveImage(tmp)
		if s.HasImage(id) {
			return nil
		}
		return err
	}
	return writeDurable(filepath.Join(s.digestsDir(), "image-"+id), []byte(want+"\n"))
}

// Get returns snapshot id, of any team.
func (s *Store) Get(id string) (*Record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.recs[id]
	if !ok {
		return nil, ErrNotFound
	}
	c := *r
	return &c, nil
}

// All returns every snapshot, of every team, newest first.
func (s *Store) All() []*Record {
	s.mu.Lock()
	out := make([]*Record, 0, len(s.recs))
	for _, r := range s.recs {
		c := *r
		out = append(out, &c)
	}
	s.mu.Unlock()
	slices.SortFunc(out, func(a, b *Record) int {
		if c := b.CreatedAt.Compare(a.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	return out
}

// nameRE is what e2b allows in a template alias, and so in a snapshot's
// name; tagRE in its tag.
var (
	nameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9_-]{0,61}[a-z0-9])?$`)
	tagRE  = regexp.MustCompile(`^[a-zA-Z0-9]([a-zA-Z0-9._-]{0,126}[a-zA-Z0-9])?$`)
)

// SplitName splits "name:tag" (a missing tag is DefaultTag).
func SplitName(ref string) (name, tag string) {
	name, tag, ok := strings.Cut(ref, ":")
	if !ok || tag == "" {
		tag = DefaultTag
	}
	return name, tag
}

// CheckName validates a snapshot name with its optional tag, in words for
// the caller.
func CheckName(ref string) error {
	name, tag := SplitName(ref)
	if !nameRE.MatchString(name) {
		return fmt.Errorf("name %q: want 1 to 63 characters of lowercase letters, digits, '-' and '_', starting and ending with a letter or digit", name)
	}
	if !tagRE.MatchString(tag) {
		return fmt.Errorf("tag %q: want 1 to 128 characters of letters, digits, '.', '-' and '_', starting and ending with a letter or digit", tag)
	}
	return nil
}

func writeDurable(path string, data []byte) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return err
	}
	return syncDir(filepath.Dir(path))
}

func syncFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}
