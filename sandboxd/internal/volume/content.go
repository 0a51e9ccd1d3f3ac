package volume

// e2b's volume content API (spec/openapi-volumecontent.yml in e2b-dev/E2B,
// whose server, e2b's "belt", fronts infra's orchestrator pkg/volumes):
// what the SDK's Volume class calls to list, read, write, stat, chmod and
// remove a volume's files without a sandbox. Paths are the volume's own
// ("/a/b"), cleaned, and never leave it: every call goes through an
// os.Root at the volume's directory, which refuses symlinks and ".." that
// lead out.
//
//	GET    dir   ?path&depth          200 [entry…] (depth 1..10, preorder)
//	POST   dir   ?path&uid&gid&mode&force   201 entry (force: parents too; an existing directory is fine)
//	GET    path  ?path                200 entry (lstat)
//	PATCH  path  ?path {uid,gid,mode} 200 entry
//	DELETE path  ?path                204 (recursive; "/" refused)
//	GET    file  ?path                200 the bytes
//	PUT    file  ?path&uid&gid&mode&force   201 entry (force: parents, and overwrite)
//
// Entries are e2b's VolumeEntryStat; mode is the permission bits only.
// What the API makes is owned by uid and gid 9090 unless told otherwise,
// and made 0777 (directories) or 0666 (files), as in e2b. Errors are e2b's
// content errors, {"code": "<status>", "message": …}: 404 for a missing
// path (the SDK's VolumePathNotFoundError), 409 for one that exists, 400
// for a path through a file and for bad parameters.

import (
	"bufio"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// e2b's defaults for what the API makes.
const (
	defaultOwner    = 9090
	defaultDirMode  = 0o777
	defaultFileMode = 0o666
	maxDepth        = 10
)

// Entry is e2b's VolumeEntryStat.
type Entry struct {
	Name   string    `json:"name"`
	Type   string    `json:"type"`
	Path   string    `json:"path"`
	Size   int64     `json:"size"`
	Mode   uint32    `json:"mode"`
	UID    uint32    `json:"uid"`
	GID    uint32    `json:"gid"`
	Atime  time.Time `json:"atime"`
	Mtime  time.Time `json:"mtime"`
	Ctime  time.Time `json:"ctime"`
	Target string    `json:"target,omitempty"`
}

// contentError is an answer other than success.
type contentError struct {
	status int
	msg    string
}

func (e *contentError) Error() string { return e.msg }

func badRequest(format string, args ...any) error {
	return &contentError{http.StatusBadRequest, fmt.Sprintf(format, args...)}
}

// classify maps a filesystem error of op on p to e2b's answer.
func classify(op, p string, err error) error {
	var ce *contentError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &ce):
		return err
	case errors.Is(err, fs.ErrNotExist):
		return &contentError{http.StatusNotFound, fmt.Sprintf("failed to %s: %q not found.", op, p)}
	case errors.Is(err, fs.ErrExist):
		return &contentError{http.StatusConflict, fmt.Sprintf("failed to %s: %q already exists", op, p)}
	case errors.Is(err, syscall.ENOTDIR):
		return &contentError{http.StatusBadRequest, fmt.Sprintf("failed to %s: a component of the path is a file, but must be a directory", op)}
	case errors.Is(err, syscall.EISDIR):
		return &contentError{http.StatusConflict, fmt.Sprintf("failed to %s: %q is a directory", op, p)}
	case errors.Is(err, syscall.ENXIO):
		// A FIFO without a reader, opened to write without blocking.
		return &contentError{http.StatusBadRequest, fmt.Sprintf("failed to %s: %q is not a regular file or a directory", op, p)}
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return &contentError{http.StatusInsufficientStorage, fmt.Sprintf("failed to %s: the volume is full", op)}
	case escapes(err):
		// A symlink to an absolute path or above the root, made inside a
		// sandbox: e2b's chroot resolves it within the volume, where it
		// is most often missing. os.Root refuses it instead.
		return &contentError{http.StatusNotFound, fmt.Sprintf("failed to %s: %q not found.", op, p)}
	}
	return fmt.Errorf("%s %q: %w", op, p, err)
}

// escapes reports whether err is os.Root's refusal of a path that leaves
// the root, which the os package does not export.
func escapes(err error) bool {
	return strings.Contains(err.Error(), "path escapes from parent")
}

// clean is e2b's path normalisation: absolute, cleaned.
func clean(p string) string { return path.Clean("/" + p) }

// rel is p (cleaned) relative to the volume's root, for os.Root.
func rel(p string) string {
	if p == "/" {
		return "."
	}
	return p[1:]
}

// stat is the entry of p, not following a symlink.
func stat(root *os.Root, p string) (*Entry, error) {
	info, err := root.Lstat(rel(p))
	if err != nil {
		return nil, err
	}
	e := entryOf(p, info)
	if e.Type == "symlink" {
		e.Target, _ = root.Readlink(rel(p))
	}
	return e, nil
}

func entryOf(p string, info fs.FileInfo) *Entry {
	e := &Entry{Name: path.Base(p), Path: p, Size: info.Size(), Mode: uint32(info.Mode().Perm()), Type: "unknown", Mtime: info.ModTime().UTC()}
	switch {
	case info.Mode().IsRegular():
		e.Type = "file"
	case info.IsDir():
		e.Type = "directory"
	case info.Mode()&fs.ModeSymlink != 0:
		e.Type = "symlink"
	}
	if st, ok := info.Sys().(*syscall.Stat_t); ok {
		e.UID, e.GID = st.Uid, st.Gid
		e.Atime = time.Unix(st.Atim.Unix()).UTC()
		e.Ctime = time.Unix(st.Ctim.Unix()).UTC()
	}
	return e
}

// openRegular opens p for I/O only if it is a regular file or a
// directory: opened without blocking (a FIFO a sandbox made would hold the
// call forever) and without following a last symlink, then checked.
func openRegular(root *os.Root, p string, flags int, mode os.FileMode) (*os.File, error) {
	f, err := root.OpenFile(rel(p), flags|unix.O_NOFOLLOW|unix.O_NONBLOCK, mode)
	if err != nil {
		return nil, err
	}
	info, err := f.Stat()
	if err == nil && !info.Mode().IsRegular() && !info.IsDir() {
		err = &contentError{http.StatusBadRequest, fmt.Sprintf("%q is not a regular file or a directory", p)}
	}
	if err == nil {
		// Back to blocking I/O for the copy (a regular file never blocks).
		err = unix.SetNonblock(int(f.Fd()), false)
	}
	if err != nil {
		_ = f.Close()
		return nil, err
	}
	return f, nil
}

// listBatch is how many entries of a directory a listing reads at a time.
const listBatch = 256

// writeList answers the entries under dir, to depth levels, in preorder
// (dir itself left out), as one JSON array written while it is read: a
// batch of each directory at a time, so that a listing of a volume's every
// file holds no more of sandboxd's memory than a batch for each level (the
// whole answer, as e2b builds it, is a few hundred MB for a volume full of
// small files, and a tenant may ask for it many times at once). A client
// that goes away ends the walk. An error before the answer has begun is
// answered; one after cuts the answer off, so that the client sees it
// broken rather than short.
func writeList(w http.ResponseWriter, root *os.Root, dir string, depth int) {
	f, err := openRegular(root, dir, os.O_RDONLY, 0)
	if err == nil {
		if info, serr := f.Stat(); serr != nil || !info.IsDir() {
			_ = f.Close()
			err = cmp.Or(serr, badRequest("failed to list: %q is not a directory", dir))
		}
	}
	if err != nil {
		writeContentError(w, classify("read", dir, err))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	l := lister{root: root, w: bufio.NewWriterSize(w, 32<<10)}
	_ = l.w.WriteByte('[')
	err = l.walk(f, dir, depth)
	if err == nil {
		_, _ = l.w.WriteString("]\n")
		err = l.w.Flush()
	}
	if err != nil {
		// Neither an answer nor an error can be written any more.
		panic(http.ErrAbortHandler)
	}
}

// lister writes a listing's entries.
type lister struct {
	root *os.Root
	w    *bufio.Writer
	n    int // entries written
}

// walk writes the entries of the open directory f, which is dir, and
// below them to depth levels; it closes f.
func (l *lister) walk(f *os.File, dir string, depth int) error {
	defer f.Close()
	for {
		infos, err := f.Readdir(listBatch)
		for _, info := range infos {
			p := path.Join(dir, info.Name())
			e := entryOf(p, info)
			if e.Type == "symlink" {
				e.Target, _ = l.root.Readlink(rel(p))
			}
			if err := l.write(e); err != nil {
				return err
			}
			if depth > 1 && e.Type == "directory" {
				sub, err := openRegular(l.root, p, os.O_RDONLY, 0)
				if errors.Is(err, fs.ErrNotExist) {
					continue // removed since it was read
				}
				if err != nil {
					return fmt.Errorf("list %q: %w", p, err)
				}
				if err := l.walk(sub, p, depth-1); err != nil {
					return err
				}
			}
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("list %q: %w", dir, err)
		}
	}
}

// write writes e, after a comma unless it is the first.
func (l *lister) write(e *Entry) error {
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	if l.n > 0 {
		_ = l.w.WriteByte(',')
	}
	l.n++
	_, err = l.w.Write(b)
	return err
}

// owner is who made entries belong to.
type owner struct {
	uid, gid int
	mode     os.FileMode
	modeSet  bool
}

// makeDir makes dir (with its parents, given force) owned by o; an
// existing directory is answered as it is when force is given.
func makeDir(root *os.Root, dir string, o owner, force bool) (*Entry, error) {
	if dir == "/" {
		if force {
			return stat(root, dir)
		}
		return nil, fs.ErrExist
	}
	if force {
		if err := makeParents(root, path.Dir(dir), o); err != nil {
			return nil, err
		}
	}
	if err := root.Mkdir(rel(dir), o.mode); err != nil {
		if errors.Is(err, fs.ErrExist) && force {
			if info, serr := root.Lstat(rel(dir)); serr == nil && info.IsDir() {
				return stat(root, dir)
			}
		}
		return nil, err
	}
	if err := own(root, dir, o); err != nil {
		return nil, err
	}
	return stat(root, dir)
}

// makeParents makes the missing directories of dir, owned by o, mode 0777.
func makeParents(root *os.Root, dir string, o owner) error {
	if dir == "/" {
		return nil
	}
	info, err := root.Lstat(rel(dir))
	if err == nil {
		if !info.IsDir() {
			return syscall.ENOTDIR
		}
		return nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err := makeParents(root, path.Dir(dir), o); err != nil {
		return err
	}
	if err := root.Mkdir(rel(dir), defaultDirMode); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	return own(root, dir, owner{uid: o.uid, gid: o.gid, mode: defaultDirMode})
}

// own gives p o's owner and mode (past the umask).
func own(root *os.Root, p string, o owner) error {
	if err := root.Lchown(rel(p), o.uid, o.gid); err != nil {
		return err
	}
	return root.Chmod(rel(p), o.mode)
}

// writeFile writes body to file p: a new file, or with force its parents
// too and over an existing file.
func writeFile(root *os.Root, p string, body io.Reader, o owner, force bool) (*Entry, error) {
	if p == "/" {
		return nil, syscall.EISDIR
	}
	flags := os.O_WRONLY | os.O_CREATE | os.O_EXCL
	if force {
		if err := makeParents(root, path.Dir(p), o); err != nil {
			return nil, err
		}
		flags = os.O_WRONLY | os.O_CREATE | os.O_TRUNC
	}
	f, err := openRegular(root, p, flags, o.mode)
	if err != nil {
		return nil, err
	}
	created := flags&os.O_EXCL != 0
	_, err = io.Copy(f, body)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		// A new file cut short (the client went, the volume is full) is
		// not left half there; an overwrite is, as after any failed write.
		if created {
			_ = root.Remove(rel(p))
		}
		return nil, err
	}
	if err := own(root, p, o); err != nil {
		return nil, err
	}
	return stat(root, p)
}

// update changes p's mode, owner and group, where set.
func update(root *os.Root, p string, uid, gid *uint32, mode *uint32) (*Entry, error) {
	if mode != nil {
		if err := root.Chmod(rel(p), os.FileMode(*mode&0o7777)); err != nil {
			return nil, err
		}
	}
	if uid != nil || gid != nil {
		u, g := -1, -1
		if uid != nil {
			u = int(*uid)
		}
		if gid != nil {
			g = int(*gid)
		}
		if err := root.Lchown(rel(p), u, g); err != nil {
			return nil, err
		}
	}
	return stat(root, p)
}

// remove removes p, a directory with everything in it.
func remove(root *os.Root, p string) error {
	if p == "/" {
		return badRequest("cannot delete root")
	}
	if _, err := root.Lstat(rel(p)); err != nil {
		return err
	}
	return root.RemoveAll(rel(p))
}

// ContentHandler serves e2b's content API for one volume, whose files are
// at dir; kind is dir, path or file (the last part of e2b's route).
func ContentHandler(w http.ResponseWriter, r *http.Request, dir, kind string) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		writeContentError(w, fmt.Errorf("open the volume: %w", err))
		return
	}
	defer root.Close()
	q := r.URL.Query()
	raw := q.Get("path")
	if raw == "" {
		writeContentError(w, badRequest("path is required"))
		return
	}
	p := clean(raw)
	o, force, err := ownerOf(q)
	if err != nil {
		writeContentError(w, err)
		return
	}
	switch kind + " " + r.Method {
	case "dir GET":
		depth := 1
		if d := q.Get("depth"); d != "" {
			if depth, err = strconv.Atoi(d); err != nil {
				writeContentError(w, badRequest("depth must be a number"))
				return
			}
			depth = max(depth, 1)
		}
		if depth > maxDepth {
			writeContentError(w, badRequest("depth must be between 1 and %d", maxDepth))
			return
		}
		writeList(w, root, p, depth)
	case "dir POST":
		if !o.modeSet {
			o.mode = defaultDirMode
		}
		e, err := makeDir(root, p, o, force)
		answer(w, http.StatusCreated, e, classify("create directory", p, err))
	case "path GET":
		e, err := stat(root, p)
		answer(w, http.StatusOK, e, classify("stat", p, err))
	case "path PATCH":
		var body struct {
			UID  *uint32 `json:"uid"`
			GID  *uint32 `json:"gid"`
			Mode *uint32 `json:"mode"`
		}
		if err := json.NewDecoder(io.LimitReader(r.Body, 1<<16)).Decode(&body); err != nil && !errors.Is(err, io.EOF) {
			writeContentError(w, badRequest("body: %v", err))
			return
		}
		e, err := update(root, p, body.UID, body.GID, body.Mode)
		answer(w, http.StatusOK, e, classify("update", p, err))
	case "path DELETE":
		if err := classify("delete", p, remove(root, p)); err != nil {
			writeContentError(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	case "file GET":
		readFile(w, root, p)
	case "file PUT":
		if !o.modeSet {
			o.mode = defaultFileMode
		}
		e, err := writeFile(root, p, r.Body, o, force)
		answer(w, http.StatusCreated, e, classify("write", p, err))
	default:
		w.Header().Set("Allow", allowed[kind])
		writeContentError(w, &contentError{http.StatusMethodNotAllowed, fmt.Sprintf("%s is not a method of /%s", r.Method, kind)})
	}
}

var allowed = map[string]string{"dir": "GET, POST", "path": "GET, PATCH, DELETE", "file": "GET, PUT"}

// ownerOf reads uid, gid, mode and force from the query.
func ownerOf(q map[string][]string) (owner, bool, error) {
	o := owner{uid: defaultOwner, gid: defaultOwner}
	get := func(k string) string {
		if v := q[k]; len(v) > 0 {
			return v[0]
		}
		return ""
	}
	for _, f := range []struct {
		key string
		dst *int
	}{{"uid", &o.uid}, {"gid", &o.gid}} {
		if v := get(f.key); v != "" {
			n, err := strconv.ParseUint(v, 10, 32)
			if err != nil {
				return o, false, badRequest("%s must be a number", f.key)
			}
			*f.dst = int(n)
		}
	}
	if v := get("mode"); v != "" {
		n, err := strconv.ParseUint(v, 10, 32)
		if err != nil {
			return o, false, badRequest("mode must be a number")
		}
		o.mode, o.modeSet = os.FileMode(n&0o777), true
	}
	force := false
	if v := get("force"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return o, false, badRequest("force must be true or false")
		}
		force = b
	}
	return o, force, nil
}

func readFile(w http.ResponseWriter, root *os.Root, p string) {
	f, err := openRegular(root, p, os.O_RDONLY, 0)
	if err != nil {
		writeContentError(w, classify("read", p, err))
		return
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		writeContentError(w, classify("read", p, err))
		return
	}
	if info.IsDir() {
		writeContentError(w, badRequest("failed to read: %q is a directory", p))
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(info.Size(), 10))
	w.WriteHeader(http.StatusOK)
	_, _ = io.Copy(w, f)
}

// answer writes v with status, or err.
func answer(w http.ResponseWriter, status int, v any, err error) {
	if err != nil {
		writeContentError(w, err)
		return
	}
	writeContentJSON(w, status, v)
}

func writeContentJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status, b = http.StatusInternalServerError, []byte(`{"code":"500","message":"encode the answer"}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// WriteContentError writes e2b's content error shape, {"code": "<status>",
// "message": msg}.
func WriteContentError(w http.ResponseWriter, status int, msg string) {
	writeContentError(w, &contentError{status, msg})
}

// writeContentError answers err in e2b's content error shape.
func writeContentError(w http.ResponseWriter, err error) {
	status, msg := http.StatusInternalServerError, err.Error()
	var ce *contentError
	if errors.As(err, &ce) {
		status, msg = ce.status, ce.msg
	}
	writeContentJSON(w, status, map[string]string{"code": strconv.Itoa(status), "message": msg})
}
