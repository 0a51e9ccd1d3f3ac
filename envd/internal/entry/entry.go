// Package entry describes filesystem entries the way envd reports them
// (filesystem.EntryInfo) and manages the e2b metadata stored on them as
// extended attributes named user.e2b.<key>.
package entry

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"unicode/utf8"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/skiff-dev/skiff/envd/proto/filesystem"
)

// MetadataPrefix is the extended-attribute prefix of e2b metadata keys.
const MetadataPrefix = "user.e2b."

// Metadata limits enforced by SetMetadata, as e2b's envd enforces them. An
// xattr name is at most 255 bytes, so a key may use what the prefix leaves.
// ext4 keeps all of an inode's xattrs in one 4 KiB block, so the stored
// names (prefix and key) and values together may take 4096 bytes.
const (
	MaxKeyLen        = 255 - len(MetadataPrefix) // 246
	MaxMetadataBytes = 4096                      // sum of all names (with the prefix) and values
)

// ErrInvalidMetadata is wrapped by SetMetadata errors about its input.
var ErrInvalidMetadata = errors.New("invalid metadata")

// Info describes path as e2b's envd does. path should be absolute; it is
// reported as given, with its own name, owner, group, modification time and
// permissions and size (an lstat). A symlink is reported as what it leads
// to: the type (FILE or DIRECTORY), mode and metadata are its target's, and
// SymlinkTarget is the target, every link on the way resolved; the SDKs
// know no symlink type (2.13.1 drops such entries from list()). A broken
// link has no type and mode 0, and its SymlinkTarget is the link's own
// path, as e2b's envd gives it. Fifos, sockets and devices have no type
// either. A missing path
// yields an error for which errors.Is(err, fs.ErrNotExist) holds.
func Info(path string) (*filesystem.EntryInfo, error) {
	fi, err := os.Lstat(path)
	if err != nil {
		return nil, err // *fs.PathError "lstat <path>: …", callers quote it
	}
	e := &filesystem.EntryInfo{
		Name:         filepath.Base(path),
		Path:         path,
		Size:         fi.Size(),
		Mode:         uint32(fi.Mode().Perm()),
		Permissions:  Permissions(fi.Mode()),
		ModifiedTime: timestamppb.New(fi.ModTime()),
		Type:         fileType(fi.Mode()),
	}
	mdPath := path
	if fi.Mode()&fs.ModeSymlink != 0 {
		target, tfi := followLink(path)
		e.SymlinkTarget = &target
		e.Type, e.Mode = filesystem.FileType_FILE_TYPE_UNSPECIFIED, 0
		if tfi != nil {
			e.Type = fileType(tfi.Mode())
			e.Mode = uint32(tfi.Mode().Perm())
			mdPath = target
		}
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		e.Owner = userName(st.Uid)
		e.Group = groupName(st.Gid)
	}
	// Metadata is best effort: only a vanished path fails Info, so that an
	// odd filesystem (proc, sysfs, FUSE) never hides an entry from ListDir.
	md, err := metadata(mdPath)
	if err != nil && errors.Is(err, fs.ErrNotExist) && mdPath == path {
		return nil, err
	}
	if err == nil && len(md) > 0 {
		e.Metadata = md
	}
	return e, nil
}

// fileType is the EntryInfo type of a file of mode m, not a symlink:
// regular files and directories have one, and nothing else does.
func fileType(m fs.FileMode) filesystem.FileType {
	switch {
	case m.IsRegular():
		return filesystem.FileType_FILE_TYPE_FILE
	case m.IsDir():
		return filesystem.FileType_FILE_TYPE_DIRECTORY
	default:
		return filesystem.FileType_FILE_TYPE_UNSPECIFIED
	}
}

// followLink resolves the symlink path as e2b's envd does: its target with
// every link on the way resolved, and the target's FileInfo. For a link
// that leads nowhere (a missing target, a loop, a component it may not
// search), target is path itself; info is nil then, and when the target
// cannot be stat'ed.
func followLink(path string) (target string, info fs.FileInfo) {
	resolved, err := filepath.EvalSymlinks(path)
	if err != nil {
		return path, nil
	}
	fi, err := os.Stat(resolved)
	if err != nil {
		return resolved, nil
	}
	return resolved, fi
}

// Permissions formats m as e2b's envd does, with Go's fs.FileMode.String:
// "-rw-r--r--" and "drwxr-xr-x" as ls -l, but "Lrwxrwxrwx" for a link,
// "prw-r--r--" for a fifo, "Srwxr-xr-x" for a socket, "Dcrw-rw-rw-" for a
// character device and "urwxr-xr-x" for a setuid file.
func Permissions(m fs.FileMode) string {
	return m.String()
}

// Name caches: only successful lookups are cached, so a user created later
// is picked up, at the cost of re-reading /etc/passwd for unknown ids.
var (
	userNames  sync.Map // uint32 → string
	groupNames sync.Map // uint32 → string
)

func userName(uid uint32) string {
	if v, ok := userNames.Load(uid); ok {
		return v.(string)
	}
	id := strconv.FormatUint(uint64(uid), 10)
	u, err := user.LookupId(id)
	if err != nil {
		return id
	}
	userNames.Store(uid, u.Username)
	return u.Username
}

func groupName(gid uint32) string {
	if v, ok := groupNames.Load(gid); ok {
		return v.(string)
	}
	id := strconv.FormatUint(uint64(gid), 10)
	g, err := user.LookupGroupId(id)
	if err != nil {
		return id
	}
	groupNames.Store(gid, g.Name)
	return g.Name
}

// Unsupported reports whether err, from SetMetadata, means that the
// filesystem has no user xattrs.
func Unsupported(err error) bool {
	return unsupported(err)
}

// unsupported reports whether err means the filesystem has no (user) xattrs.
func unsupported(err error) bool {
	return errors.Is(err, unix.ENOTSUP) || errors.Is(err, unix.EOPNOTSUPP)
}

// listXattrs returns the names of path's extended attributes.
func listXattrs(path string) ([]string, error) {
	for {
		n, err := unix.Llistxattr(path, nil)
		if err != nil {
			if unsupported(err) {
				return nil, nil
			}
			return nil, fmt.Errorf("list xattrs of %s: %w", path, err)
		}
		if n == 0 {
			return nil, nil
		}
		buf := make([]byte, n)
		n, err = unix.Llistxattr(path, buf)
		if errors.Is(err, unix.ERANGE) {
			continue // grew between the two calls
		}
		if err != nil {
			if unsupported(err) {
				return nil, nil
			}
			return nil, fmt.Errorf("list xattrs of %s: %w", path, err)
		}
		var names []string
		for _, name := range strings.Split(string(buf[:n]), "\x00") {
			if name != "" {
				names = append(names, name)
			}
		}
		return names, nil
	}
}

// getXattr reads one attribute; ok is false when it vanished meanwhile.
func getXattr(path, name string) (value string, ok bool, err error) {
	for {
		n, err := unix.Lgetxattr(path, name, nil)
		if errors.Is(err, unix.ENODATA) {
			return "", false, nil
		}
		if err != nil {
			return "", false, fmt.Errorf("get xattr %s of %s: %w", name, path, err)
		}
		buf := make([]byte, n)
		n, err = unix.Lgetxattr(path, name, buf)
		switch {
		case errors.Is(err, unix.ERANGE):
			continue
		case errors.Is(err, unix.ENODATA):
			return "", false, nil
		case err != nil:
			return "", false, fmt.Errorf("get xattr %s of %s: %w", name, path, err)
		}
		return string(buf[:n]), true, nil
	}
}

// metadata returns path's user.e2b.* attributes keyed without the prefix.
// An attribute whose key or value is not valid UTF-8 is left out, as e2b's
// envd leaves it out: one can be set inside the sandbox (setfattr), and a
// protobuf string must be UTF-8, so it would fail the encoding of every
// Stat, ListDir and watch event that carries the entry.
func metadata(path string) (map[string]string, error) {
	names, err := listXattrs(path)
	if err != nil {
		return nil, err
	}
	var md map[string]string
	for _, name := range names {
		key, ok := strings.CutPrefix(name, MetadataPrefix)
		if !ok || key == "" {
			continue
		}
		v, ok, err := getXattr(path, name)
		if err != nil {
			if unsupported(err) {
				continue
			}
			return nil, err
		}
		if !ok || !utf8.ValidString(key) || !utf8.ValidString(v) {
			continue
		}
		if md == nil {
			md = make(map[string]string)
		}
		md[key] = v
	}
	return md, nil
}

// ValidateMetadata checks md against the limits SetMetadata enforces, those
// of e2b's envd, and returns it with lowercased keys: keys not empty and at
// most MaxKeyLen bytes, keys and values printable ASCII (0x20-0x7e, what an
// X-Metadata-* header carries), and the stored names (MetadataPrefix and
// key) and values together at most MaxMetadataBytes. Errors wrap
// ErrInvalidMetadata and read as e2b's ("invalid metadata: metadata key must
// not be empty").
func ValidateMetadata(md map[string]string) (map[string]string, error) {
	out := make(map[string]string, len(md))
	total := 0
	for k, v := range md {
		k = strings.ToLower(k)
		if k == "" {
			return nil, fmt.Errorf("%w: metadata key must not be empty", ErrInvalidMetadata)
		}
		if len(k) > MaxKeyLen {
			return nil, fmt.Errorf("%w: metadata key %q exceeds %d bytes", ErrInvalidMetadata, k, MaxKeyLen)
		}
		if err := printableASCII("key", k); err != nil {
			return nil, err
		}
		if err := printableASCII(fmt.Sprintf("value for key %q", k), v); err != nil {
			return nil, err
		}
		if _, dup := out[k]; dup {
			return nil, fmt.Errorf("%w: metadata keys collide once lowercased: %q", ErrInvalidMetadata, k)
		}
		out[k] = v
		total += len(MetadataPrefix) + len(k) + len(v)
	}
	if total > MaxMetadataBytes {
		return nil, fmt.Errorf("%w: total metadata size %d exceeds %d bytes", ErrInvalidMetadata, total, MaxMetadataBytes)
	}
	return out, nil
}

// printableASCII fails unless every byte of s is printable ASCII.
func printableASCII(label, s string) error {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e {
			return fmt.Errorf("%w: metadata %s contains non-printable-ASCII byte 0x%02x at offset %d", ErrInvalidMetadata, label, c, i)
		}
	}
	return nil
}

// SetMetadata replaces every user.e2b.* attribute of path (not following a
// final symlink) with md: keys in md are set (lowercased), others removed.
// Bad input yields an error wrapping ErrInvalidMetadata; a filesystem
// without user xattrs yields an error wrapping unix.ENOTSUP.
func SetMetadata(path string, md map[string]string) error {
	md, err := ValidateMetadata(md)
	if err != nil {
		return err
	}
	if _, err := os.Lstat(path); err != nil {
		return err
	}
	names, err := listXattrs(path)
	if err != nil {
		return err
	}
	// Set the new values first, then drop the stale keys, so a failure
	// midway leaves no key of md missing that was there before.
	for k, v := range md {
		if err := unix.Lsetxattr(path, MetadataPrefix+k, []byte(v), 0); err != nil {
			return fmt.Errorf("set xattr %s%s of %s: %w", MetadataPrefix, k, path, err)
		}
	}
	for _, name := range names {
		key, ok := strings.CutPrefix(name, MetadataPrefix)
		if !ok {
			continue
		}
		if _, keep := md[key]; keep {
			continue
		}
		if err := unix.Lremovexattr(path, name); err != nil && !errors.Is(err, unix.ENODATA) {
			return fmt.Errorf("remove xattr %s of %s: %w", name, path, err)
		}
	}
	return nil
}
