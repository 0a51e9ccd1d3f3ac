package sandboxrt

import (
	"crypto/sha256"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"sync"
)

// EnvdCopies keeps the copies of envd binaries that a runtime's sandboxes
// run, in a directory of the runtime's own. A copy is what sandboxes can
// reach (the original may sit under a directory they cannot search, like
// /root), and what an upgrade of the original does not change under running
// sandboxes — nor under paused ones, so a restore finds the binary its
// checkpoint was taken with. One copy is made per distinct binary (path,
// size and modification time).
type EnvdCopies struct {
	// Dir holds the copies; Perm is its mode.
	Dir  string
	Perm os.FileMode

	mu sync.Mutex
}

// Copy returns the path of the copy of the envd binary at path, making it
// if there is none yet.
func (c *EnvdCopies) Copy(path string) (string, error) {
	st, err := os.Stat(path)
	if err != nil {
		return "", fmt.Errorf("envd: %w", err)
	}
	if !st.Mode().IsRegular() {
		return "", fmt.Errorf("envd: %s is not a regular file", path)
	}
	key := sha256.Sum256([]byte(path + "\x00" + strconv.FormatInt(st.Size(), 10) + "\x00" + strconv.FormatInt(st.ModTime().UnixNano(), 10)))
	dst := filepath.Join(c.Dir, fmt.Sprintf("envd-%x", key[:6]))
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, err := os.Stat(dst); err == nil {
		return dst, nil
	}
	if err := os.MkdirAll(c.Dir, c.Perm); err != nil {
		return "", fmt.Errorf("envd: %w", err)
	}
	src, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("envd: %w", err)
	}
	defer src.Close()
	tmp, err := os.CreateTemp(c.Dir, ".envd-*")
	if err != nil {
		return "", fmt.Errorf("envd: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := io.Copy(tmp, src); err != nil {
		_ = tmp.Close()
		return "", fmt.Errorf("envd: copy %s: %w", path, err)
	}
	if err := tmp.Chmod(0o755); err != nil {
		_ = tmp.Close()
		return "", fmt.Errorf("envd: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return "", fmt.Errorf("envd: %w", err)
	}
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return "", fmt.Errorf("envd: %w", err)
	}
	return dst, nil
}
