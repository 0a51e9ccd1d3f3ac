package store

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/skiff-dev/skiff/shared/sandboxid"
)

func record(n int) *Record {
	id := fmt.Sprintf("%016d", n) + string(sandboxid.NodeTag("n1"))
	return &Record{
		ID: id, Template: "base", State: "running", Team: "team-a",
		Metadata:  map[string]string{"n": strconv.Itoa(n)},
		StartedAt: time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC), EndAt: time.Date(2026, 11, 29, 13, 0, 0, 0, time.UTC),
		CPUMilli: 2000, MemoryMiB: 512, EnvdAccessToken: "token-" + strconv.Itoa(n), Runtime: "native",
		RuntimeState: json.RawMessage(`{"pid":123}`), AllowInternetAccess: true,
	}
}

func TestPutGetLoadDelete(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	a, b := record(2), record(1)
	a.TrafficAccessToken, a.AutoResume, a.Timeout = "traffic-2", true, 90*time.Second
	for _, r := range []*Record{a, b} {
		if err := s.Put(r); err != nil {
			t.Fatal(err)
		}
	}
	got, err := s.Get(a.ID)
	if err != nil || got.EnvdAccessToken != a.EnvdAccessToken || got.Schema != SchemaVersion || string(got.RuntimeState) != `{"pid":123}` || !got.EndAt.Equal(a.EndAt) {
		t.Fatalf("Get = %+v, %v", got, err)
	}
	if got.TrafficAccessToken != "traffic-2" || !got.AutoResume || got.Timeout != 90*time.Second {
		t.Fatalf("Get lost the traffic token, auto-resume or timeout: %+v", got)
	}
	// A record without a traffic token keeps the schema every sandboxd
	// reads; one with a token needs a sandboxd that enforces it.
	if got, err := s.Get(b.ID); err != nil || got.Schema != 1 || got.TrafficAccessToken != "" || got.AutoResume || got.Timeout != 0 {
		t.Fatalf("Get of a public record = %+v, %v; want schema 1", got, err)
	}
	a.State = "paused"
	if err := s.Put(a); err != nil {
		t.Fatal(err)
	}
	all, err := s.Load()
	if err != nil || len(all) != 2 || all[0].ID != b.ID || all[1].State != "paused" {
		t.Fatalf("Load = %v, %v; want both, sorted, with a paused", all, err)
	}
	if err := s.Delete(a.ID); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(a.ID); err != nil {
		t.Fatalf("second Delete = %v, want nil", err)
	}
	if _, err := s.Get(a.ID); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get after Delete = %v, want ErrNotFound", err)
	}
	// Records hold tokens: only the owner reads them. Each record is one
	// file: a replaced version is gone.
	files, _ := filepath.Glob(filepath.Join(dir, "*"))
	if len(files) != 1 || !strings.HasPrefix(filepath.Base(files[0]), b.ID+".") {
		t.Fatalf("state directory holds %v, want b's record alone", files)
	}
	fi, err := os.Stat(files[0])
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("record mode = %v, %v; want 0600", fi.Mode(), err)
	}
	// A reopened store continues the numbering and finds the record.
	s, err = Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := s.Get(b.ID); err != nil || got.ID != b.ID {
		t.Fatalf("Get after reopening = %v, %v", got, err)
	}
	if err := s.Put(b); err != nil {
		t.Fatal(err)
	}
	if again, _ := filepath.Glob(filepath.Join(dir, "*")); len(again) != 1 || again[0] == files[0] {
		t.Fatalf("after a Put on the reopened store: %v (before: %v), want one new file", again, files)
	}
}

// Load takes a record's newest file that reads whole: a newer one that a
// kill cut short and older ones a crash left are removed; a record in the
// single-file name of earlier sandboxds loads and is replaced by the next
// Put.
func TestLoadPicksNewestWholeVersion(t *testing.T) {
	dir := t.TempDir()
	torn, leftover, legacy := record(1), record(2), record(3)
	write := func(name string, r *Record, cut int) {
		t.Helper()
		data, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), data[:len(data)-cut], 0o600); err != nil {
			t.Fatal(err)
		}
	}
	torn.Schema, leftover.Schema, legacy.Schema = 1, 1, 1
	write(torn.ID+".7.json", torn, 0)
	torn.EnvdAccessToken = "cut-short"
	write(torn.ID+".9.json", torn, 10)
	write(leftover.ID+".3.json", leftover, 0)
	leftover.EnvdAccessToken = "newest"
	write(leftover.ID+".8.json", leftover, 0)
	write(legacy.ID+".json", legacy, 0)

	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	all, err := s.Load()
	if err != nil || len(all) != 3 {
		t.Fatalf("Load = %v, %v; want 3 records", all, err)
	}
	if all[0].EnvdAccessToken != "token-1" || all[1].EnvdAccessToken != "newest" || all[2].EnvdAccessToken != "token-3" {
		t.Fatalf("Load took %q, %q, %q; want the whole newest of each", all[0].EnvdAccessToken, all[1].EnvdAccessToken, all[2].EnvdAccessToken)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*"))
	slices.Sort(files)
	want := []string{torn.ID + ".7.json", leftover.ID + ".8.json", legacy.ID + ".json"}
	for i := range want {
		want[i] = filepath.Join(dir, want[i])
	}
	if !slices.Equal(files, want) {
		t.Fatalf("after Load the directory holds %v, want %v", files, want)
	}
	if err := s.Put(legacy); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, legacy.ID+".json")); !os.IsNotExist(err) {
		t.Fatalf("the single-file record outlived a Put: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, legacy.ID+".10.json")); err != nil {
		t.Fatalf("a Put after files up to number 9 should write number 10: %v", err)
	}
}

func TestInvalidIDs(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"", "../../etc/passwd", "ABC", "x", strings.Repeat("a", 21), "aaaaaaaaaaaaaaaaaaa/"} {
		if err := s.Put(&Record{ID: id}); err == nil {
			t.Errorf("Put(%q) succeeded", id)
		}
		if _, err := s.Get(id); err == nil || errors.Is(err, ErrNotFound) {
			t.Errorf("Get(%q) = %v, want an invalid-ID error", id, err)
		}
		if err := s.Delete(id); err == nil {
			t.Errorf("Delete(%q) succeeded", id)
		}
	}
}

// Open removes what a crash between write and rename left; Load moves a
// damaged or too-new record aside and still loads the others.
func TestRecoveryFromDebris(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	good := record(1)
	if err := s.Put(good); err != nil {
		t.Fatal(err)
	}
	damaged, future := record(2), record(3)
	if err := os.WriteFile(filepath.Join(dir, damaged.ID+recordExt), []byte(`{"id":"`), 0o600); err != nil {
		t.Fatal(err)
	}
	newer, _ := json.Marshal(map[string]any{"schema": SchemaVersion + 1, "id": future.ID})
	if err := os.WriteFile(filepath.Join(dir, future.ID+recordExt), newer, 0o600); err != nil {
		t.Fatal(err)
	}
	leftover := filepath.Join(dir, tempPrefix+"x.json-123")
	if err := os.WriteFile(leftover, []byte("half"), 0o600); err != nil {
		t.Fatal(err)
	}

	s, err = Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(leftover); !os.IsNotExist(err) {
		t.Fatalf("leftover temporary file: %v, want removed", err)
	}
	all, err := s.Load()
	if len(all) != 1 || all[0].ID != good.ID {
		t.Fatalf("Load = %v, want only the good record", all)
	}
	if err == nil || !strings.Contains(err.Error(), damaged.ID) || !strings.Contains(err.Error(), "newer than") {
		t.Fatalf("Load error = %v, want both bad records named", err)
	}
	moved, _ := filepath.Glob(filepath.Join(dir, corruptDir, "*"))
	if len(moved) != 2 {
		t.Fatalf("corrupt/ holds %v, want the two bad records", moved)
	}
	if all, err := s.Load(); err != nil || len(all) != 1 {
		t.Fatalf("second Load = %v, %v; want the good record and no error", all, err)
	}
}

// A writer killed with SIGKILL at an arbitrary instant leaves every record
// whole: each is the last version written or the one before, never torn.
func TestKilledWriterLeavesWholeRecords(t *testing.T) {
	if dir := os.Getenv("STORE_WRITER_DIR"); dir != "" {
		writeForever(dir, os.Getenv("STORE_WRITER_SYNC") == "1")
		return
	}
	// Atomicity against a killed process must not depend on fsync, which
	// sandboxd skips for most records.
	for _, durable := range []string{"1", "0"} {
		t.Run("fsync="+durable, func(t *testing.T) { killWriter(t, durable) })
	}
}

func killWriter(t *testing.T, durable string) {
	dir := t.TempDir()
	for round := range 5 {
		cmd := exec.Command(os.Args[0], "-test.run=^TestKilledWriterLeavesWholeRecords$")
		cmd.Env = append(os.Environ(), "STORE_WRITER_DIR="+dir, "STORE_WRITER_SYNC="+durable)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// Kill it after it has written a while, mid-stream.
		sc := bufio.NewScanner(out)
		for i := 0; sc.Scan() && i < 10*(round+1); i++ {
		}
		_ = cmd.Process.Kill()
		_ = cmd.Wait()

		s, err := Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		all, err := s.Load()
		if err != nil {
			t.Fatalf("round %d: Load after kill: %v", round, err)
		}
		if len(all) == 0 {
			t.Fatalf("round %d: no records after the writer ran", round)
		}
		for _, r := range all {
			if r.Metadata["n"] == "" || r.EnvdAccessToken != "token-"+r.Metadata["n"] {
				t.Fatalf("round %d: torn record %+v", round, r)
			}
		}
	}
}

// writeForever rewrites 10 records with growing versions, printing a line
// per write, until killed.
func writeForever(dir string, durable bool) {
	s, err := Open(dir)
	if err != nil {
		panic(err)
	}
	s.SetSync(func(*Record) bool { return durable })
	for v := 0; ; v++ {
		r := record(v % 10)
		r.Metadata["n"] = strconv.Itoa(v)
		r.EnvdAccessToken = "token-" + strconv.Itoa(v)
		r.Template = strings.Repeat("t", (v%8)*(128<<10)) // records up to ~1 MB: a torn write would show
		if err := s.Put(r); err != nil {
			panic(err)
		}
		fmt.Println(v)
	}
}

// A deletion is made durable (the directory synced) only for a record that
// may be on stable storage: one written durably, or found at Open; not for
// one only ever written without a sync, which a power loss takes anyway.
func TestDeleteSyncsOnlyWhatMayBeStable(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	s.SetSync(func(r *Record) bool { return r.State == "paused" })
	syncs := 0
	s.syncDir = func(d string) error { syncs++; return syncDir(d) }
	running, paused, resumed := record(1), record(2), record(3)
	paused.State, resumed.State = "paused", "paused"
	for _, r := range []*Record{running, paused, resumed} {
		if err := s.Put(r); err != nil {
			t.Fatal(err)
		}
	}
	resumed.State = "running" // its paused version may still be on disk
	if err := s.Put(resumed); err != nil {
		t.Fatal(err)
	}
	if syncs != 2 {
		t.Fatalf("%d syncs for two durable writes", syncs)
	}
	for _, c := range []struct {
		r    *Record
		want int
	}{{running, 0}, {paused, 1}, {resumed, 1}} {
		syncs = 0
		if err := s.Delete(c.r.ID); err != nil {
			t.Fatal(err)
		}
		if syncs != c.want {
			t.Errorf("deleting %s (last %s): %d syncs, want %d", c.r.ID, c.r.State, syncs, c.want)
		}
	}
	// What a restart finds may have been durable.
	if err := s.Put(running); err != nil {
		t.Fatal(err)
	}
	again, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	syncs = 0
	again.syncDir = func(d string) error { syncs++; return syncDir(d) }
	if err := again.Delete(running.ID); err != nil || syncs != 1 {
		t.Errorf("deleting a record found at Open: %v, %d syncs, want 1", err, syncs)
	}
}
