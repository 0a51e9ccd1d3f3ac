package files

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
)

// TestProcessDescriptorsOutOfReach: no upload, download or compose reaches
// a file through one of envd's own descriptors (/proc/self/fd/N, a link a
// sandbox process planted to it, /dev/stdout): envd's stdout is the host's
// log file. The file behind the descriptor stays as it was.
func TestProcessDescriptorsOutOfReach(t *testing.T) {
	dir := t.TempDir()
	behind := filepath.Join(dir, "behind-a-descriptor")
	if err := os.WriteFile(behind, []byte("log line\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	held, err := os.OpenFile(behind, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	magic := fmt.Sprintf("/proc/self/fd/%d", held.Fd())
	planted := filepath.Join(dir, "report.txt")
	if err := os.Symlink(magic, planted); err != nil {
		t.Fatal(err)
	}
	// As the host's log file is from a sandbox, the file is out of reach
	// by any name: only the descriptor leads to it. (A descriptor of a file
	// the sandbox can name resolves to that name, and is written there.)
	if err := os.Remove(behind); err != nil {
		t.Fatal(err)
	}
	h, _ := newHandler(t, "")
	for _, p := range []string{magic, planted} {
		rec := do(h, uploadAs(t, "octet", "root", p, "overwritten"))
		wantError(t, rec, http.StatusBadRequest, "descriptors")
		rec = do(h, httptest.NewRequest(http.MethodGet, filesURL("/files", "path", p, "username", "root"), nil))
		if rec.Code == http.StatusOK {
			t.Errorf("download of %s = 200 %q, want a refusal", p, rec.Body)
		}
	}
	rec := do(h, uploadAs(t, "octet", "root", "/dev/stdout", "to envd's stdout"))
	wantError(t, rec, http.StatusBadRequest, "descriptors")
	got := make([]byte, 64)
	n, err := held.ReadAt(got, 0)
	if got = got[:n]; string(got) != "log line\n" {
		t.Fatalf("the file behind the descriptor = %q, %v; want it untouched", got, err)
	}
}

// TestReachesProcess: where the kernel has no openat2, the paths refused
// are those in or into /proc and /dev/fd, /dev/std*, and links that do not
// resolve; the rest are opened.
func TestReachesProcess(t *testing.T) {
	dir := t.TempDir()
	dangling := filepath.Join(dir, "dangling")
	if err := os.Symlink(filepath.Join(dir, "nowhere"), dangling); err != nil {
		t.Fatal(err)
	}
	toProc := filepath.Join(dir, "to-proc")
	if err := os.Symlink("/proc/version", toProc); err != nil {
		t.Fatal(err)
	}
	plain := filepath.Join(dir, "plain")
	if err := os.WriteFile(plain, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]bool{
		"/proc/self/fd/1": true, "/proc/version": true, "/dev/fd/1": true, "/dev/stdout": true, "/dev/stderr": true,
		toProc: true, dangling: true, plain: false, filepath.Join(dir, "new"): false, "/dev/null": false, "/processes": false,
	} {
		if got := reachesProcess(p); got != want {
			t.Errorf("reachesProcess(%s) = %v, want %v", p, got, want)
		}
	}
}
