package gvisor

import (
	"crypto/sha256"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
)

// envdCopy returns a copy of the envd binary at path inside the runtime's
// directory, which an upgrade of the original does not change under running
// sandboxes, nor under paused ones: a restore finds the same binary the
// checkpoint was taken with. One copy is made per distinct binary.
func (r *Runtime) envdCopy(path string) (string, error) {
	st, err := os.Stat(path)
	if err != nil {
		return "", fmt.Errorf("envd: %w", err)
	}
	if !st.Mode().IsRegular() {
		return "", fmt.Errorf("envd: %s is not a regular file", path)
	}
	key := sha256.Sum256([]byte(path + "\x00" + strconv.FormatInt(st.Size(), 10) + "\x00" + strconv.FormatInt(st.ModTime().UnixNano(), 10)))
	dst := filepath.Join(r.opts.Dir, "bin", fmt.Sprintf("envd-%x", key[:6]))
	r.envdMu.Lock()
	defer r.envdMu.Unlock()
	if _, err := os.Stat(dst); err == nil {
		return dst, nil
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		return "", fmt.Errorf("envd: %w", err)
	}
	src, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("envd: %w", err)
	}
	defer src.Close()
	tmp, err := os.CreateTemp(filepath.Dir(dst), ".envd-*")
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
