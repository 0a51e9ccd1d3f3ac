// Package mountinfo reads the mount points of this process's mount
// namespace from /proc/self/mountinfo.
package mountinfo

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Under lists the mount points at or below dir, in the order the kernel
// lists them: a mount before those on top of it. dir is made absolute and
// its symbolic links resolved first, as the kernel lists mount points.
func Under(dir string) ([]string, error) {
	dir, err := Resolve(dir)
	if err != nil {
		return nil, err
	}
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	return ParseUnder(data, dir), nil
}

// Resolve is dir as mountinfo names a mount point there: absolute, its
// symbolic links resolved (a dir that does not exist yet is kept as it is).
func Resolve(dir string) (string, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	if real, err := filepath.EvalSymlinks(dir); err == nil {
		return real, nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return "", err
	}
	return dir, nil
}

// ParseUnder is Under of mountinfo, the text of a mountinfo file.
func ParseUnder(mountinfo []byte, dir string) []string {
	var out []string
	for line := range strings.Lines(string(mountinfo)) {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		mp := Unescape(f[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	return out
}

// Unescape undoes mountinfo's octal escapes (\040 for a space) in a
// mount point or source.
func Unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
