package snapshot

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/skiff-dev/skiff/sandboxd/internal/layer"
)

const (
	idA = "aaaaaaaaaaaaaaaatag1"
	idB = "bbbbbbbbbbbbbbbbtag1"
	idC = "cccccccccccccccctag1"
)

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// newLayer writes a layer with one file and puts it in place.
func newLayer(t *testing.T, s *Store) string {
	t.Helper()
	id, tmp, err := s.NewLayer()
	must(t, err)
	must(t, os.Mkdir(tmp, 0o755))
	must(t, os.WriteFile(filepath.Join(tmp, "f"), []byte("x"), 0o644))
	must(t, s.CommitLayer(id, tmp))
	return id
}

func ids(recs []*Record) []string {
	var out []string
	for _, r := range recs {
		out = append(out, r.ID)
	}
	return out
}

func TestStore(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir)
	must(t, err)
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	l1, l2 := newLayer(t, s), newLayer(t, s)
	must(t, s.Put(&Record{ID: idA, Team: "a", SourceSandbox: "s1", Layers: []string{l1}, CreatedAt: t0}))
	must(t, s.Put(&Record{ID: idB, Team: "a", Name: "snap", Tag: "v1", SourceSandbox: "s2", Layers: []string{l2, l1}, CreatedAt: t0.Add(time.Second)}))
	must(t, s.Put(&Record{ID: idC, Team: "b", Name: "snap", Tag: DefaultTag, SourceSandbox: "s3", CreatedAt: t0.Add(2 * time.Second)}))

	for ref, want := range map[string]string{idA: idA, "snap:v1": idB, "snap": "", idC: ""} {
		r, err := s.Find("a", ref)
		switch {
		case want == "" && err == nil:
			t.Errorf("Find(a, %q) = %s, want none", ref, r.ID)
		case want != "" && (err != nil || r.ID != want):
			t.Errorf("Find(a, %q) = %v, %v; want %s", ref, r, err, want)
		}
	}
	for f, want := range map[Filter][]string{
		{Team: "a"}:                        {idB, idA},
		{Team: "a", SourceSandbox: "s1"}:   {idA},
		{Team: "a", Name: "snap"}:          {idB},
		{Team: "a", Name: "snap:v1"}:       {idB},
		{Team: "a", Name: "snap:default"}:  nil,
		{Team: "a", Name: idA}:             {idA},
		{Team: "b"}:                        {idC},
		{Team: "c"}:                        nil,
		{Team: "b", Name: "snap:default"}:  {idC},
		{Team: "a", SourceSandbox: "none"}: nil,
	} {
		if got := ids(s.List(f)); !slices.Equal(got, want) {
			t.Errorf("List(%+v) = %v, want %v", f, got, want)
		}
	}

	// What a crash can leave: a half-written layer, a record's temporary
	// file, a whole layer no record names. Open removes the first two; GC
	// the third, and keeps what records and sandboxes use.
	_, tmp, err := s.NewLayer()
	must(t, err)
	must(t, os.Mkdir(tmp, 0o755))
	must(t, os.WriteFile(filepath.Join(dir, "records", idA+".json.tmp"), []byte("{half"), 0o600))
	orphan, used := newLayer(t, s), newLayer(t, s)

	s2, err := Open(dir)
	must(t, err)
	if _, err := os.Stat(tmp); !os.IsNotExist(err) {
		t.Errorf("a half-written layer survived Open: %v", err)
	}
	if got := ids(s2.List(Filter{Team: "a"})); !slices.Equal(got, []string{idB, idA}) {
		t.Errorf("records after reopen: %v", got)
	}
	n, err := s2.GC(map[string]bool{used: true})
	must(t, err)
	if n != 1 {
		t.Errorf("GC removed %d layers, want 1 (the orphan)", n)
	}
	for _, l := range []string{l1, l2, used} {
		if _, err := os.Stat(s2.LayerPath(l)); err != nil {
			t.Errorf("layer %s in use was removed: %v", l, err)
		}
	}
	if _, err := os.Stat(s2.LayerPath(orphan)); !os.IsNotExist(err) {
		t.Errorf("the orphan layer is left: %v", err)
	}

	// Delete: gone from the store and from disk; layers go at the next GC.
	must(t, s2.Delete(idB))
	if err := s2.Delete(idB); !errors.Is(err, ErrNotFound) {
		t.Errorf("a second delete: %v", err)
	}
	s3, err := Open(dir)
	must(t, err)
	if _, err := s3.Find("a", idB); err == nil {
		t.Error("a deleted snapshot came back after reopen")
	}
	if n, err := s3.GC(nil); err != nil || n != 2 {
		t.Errorf("GC after delete removed %d (%v), want 2 (l2 and the one in use before)", n, err)
	}
	if _, err := os.Stat(s3.LayerPath(l1)); err != nil {
		t.Errorf("l1, still named by %s, was removed", idA)
	}
}

func TestOpenRefusesNewerSchema(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir)
	must(t, err)
	must(t, s.Put(&Record{ID: idA, Team: "a"}))
	path := filepath.Join(dir, "records", idA+".json")
	data, err := os.ReadFile(path)
	must(t, err)
	must(t, os.WriteFile(path, []byte(strings.Replace(string(data), `"schema":1`, `"schema":9`, 1)), 0o600))
	if _, err := Open(dir); err == nil || !strings.Contains(err.Error(), "newer") {
		t.Errorf("Open of a newer record: %v", err)
	}
}

func TestCheckName(t *testing.T) {
	for _, ok := range []string{"snap", "my-snap_1", "snap:v1", "snap:1.0-rc_2", "a"} {
		if err := CheckName(ok); err != nil {
			t.Errorf("CheckName(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"", "Snap", "-snap", "snap-", "sn ap", "snap:-x", "snap:a:b", strings.Repeat("a", 64)} {
		if err := CheckName(bad); err == nil {
			t.Errorf("CheckName(%q) accepted", bad)
		}
	}
}

// An image is committed whole or not at all, goes with its record, and a
// temporary one (a cut capture, a fork's) is gone at the next Open.
func TestImages(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir)
	must(t, err)
	newImage := func() (string, string) {
		id, tmp, err := s.NewImage()
		must(t, err)
		must(t, os.MkdirAll(filepath.Join(tmp, "state"), 0o700))
		must(t, os.WriteFile(filepath.Join(tmp, "state", "pages.img"), []byte("0123456789"), 0o600))
		must(t, os.WriteFile(filepath.Join(tmp, "image.json"), []byte("{}"), 0o600))
		return id, tmp
	}
	kept, keptTmp := newImage()
	n, err := s.CommitImage(kept, keptTmp)
	must(t, err)
	if n != 12 {
		t.Errorf("CommitImage size = %d, want 12", n)
	}
	if _, err := os.Stat(filepath.Join(s.ImagePath(kept), "state", "pages.img")); err != nil {
		t.Errorf("the committed image: %v", err)
	}
	must(t, s.Put(&Record{ID: idA, Team: "a", Image: kept, ImageFormat: "f"}))
	orphan, orphanTmp := newImage()
	_, err = s.CommitImage(orphan, orphanTmp)
	must(t, err)
	_, cut := newImage()

	if _, err := s.GC(nil); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(s.ImagePath(orphan)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("an image no record names survived GC: %v", err)
	}
	if _, err := os.Stat(s.ImagePath(kept)); err != nil {
		t.Errorf("GC removed a record's image: %v", err)
	}
	if _, err := os.Stat(cut); err != nil {
		t.Errorf("GC removed an image being written: %v", err)
	}

	s, err = Open(dir)
	must(t, err)
	if _, err := os.Stat(cut); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Open left a temporary image: %v", err)
	}
	if r, err := s.Find("a", idA); err != nil || r.Image != kept {
		t.Fatalf("after Open: %+v, %v", r, err)
	}
	must(t, s.Delete(idA))
	if _, err := s.GC(nil); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(s.ImagePath(kept)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the image of a deleted snapshot survived GC: %v", err)
	}
}

// Two imports of one layer at once (two snapshots of one lineage pulled
// together) each write a tree of their own: one that starts while the
// other is half way neither removes nor writes into the other's, both
// succeed, and the layer in place is whole, with nothing left beside it.
func TestImportLayerTwiceAtOnce(t *testing.T) {
	s, err := Open(t.TempDir())
	must(t, err)
	src := t.TempDir()
	for i := range 64 {
		must(t, os.WriteFile(filepath.Join(src, fmt.Sprintf("f%02d", i)), bytes.Repeat([]byte{'x'}, 4096), 0o644))
	}
	var tarball bytes.Buffer
	must(t, layer.WriteTar(src, &tarball))
	sum := sha256.Sum256(tarball.Bytes())
	want := "sha256:" + hex.EncodeToString(sum[:])
	id := strings.Repeat("ab", 12)

	// The first import reads half of the tar, then waits.
	pr, pw := io.Pipe()
	first := make(chan error, 1)
	go func() { first <- s.ImportLayer(id, want, pr) }()
	half := tarball.Len() / 2
	_, err = pw.Write(tarball.Bytes()[:half])
	must(t, err)
	must(t, s.ImportLayer(id, want, bytes.NewReader(tarball.Bytes())))
	go func() {
		_, err := pw.Write(tarball.Bytes()[half:])
		pw.CloseWithError(err)
	}()
	select {
	case err := <-first:
		_ = pr.Close() // a failed import reads no more
		if err != nil {
			t.Fatalf("the import that started first: %v, want it to find the layer in place", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the import that started first did not end")
	}
	entries, err := os.ReadDir(s.LayerPath(id))
	must(t, err)
	if len(entries) != 64 {
		t.Fatalf("the layer in place has %d files, want 64", len(entries))
	}
	left, err := os.ReadDir(s.layersDir())
	must(t, err)
	if len(left) != 1 {
		t.Fatalf("%d entries in the layers' folder, want the layer alone", len(left))
	}
}
