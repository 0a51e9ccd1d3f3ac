//go:build cgo

package native

// #include "userns_owner.h"
import "C"

import (
	"fmt"
	"os"
	"syscall"
)

// ownerSteps name the steps of skiff_userns_new, for its errors.
var ownerSteps = map[C.int]string{
	C.SKIFF_USERNS_CLONE:     "clone its owner",
	C.SKIFF_USERNS_SETGROUPS: "drop its owner's groups",
	C.SKIFF_USERNS_SETGID:    "set its owner's gid",
	C.SKIFF_USERNS_SETUID:    "set its owner's uid",
	C.SKIFF_USERNS_PDEATHSIG: "set its owner's parent-death signal",
	C.SKIFF_USERNS_UNSHARE:   "unshare",
	C.SKIFF_USERNS_UIDMAP:    "write uid_map",
	C.SKIFF_USERNS_GIDMAP:    "write gid_map",
	C.SKIFF_USERNS_OPEN:      "open it",
}

// newUserns makes the user namespace of one sandbox: it maps the
// sandbox's 0..65535 to base..base+65535, for uids and gids alike, and it
// is owned by host uid base, the sandbox's root, rather than by host root.
//
// The owner is who the kernel charges the per-user counts of everything
// made inside the namespace (inotify instances and watches, pending
// signals, POSIX message queue bytes, user namespaces): each is counted
// once for the user inside and once more for the namespace's owner, against
// the host's per-user limits (fs.inotify.max_user_instances, …). A
// namespace made by sandboxd itself would be owned by host root, so every
// sandbox would share root's counts, and one sandbox holding 128 inotify
// instances would leave host root and every other sandbox with EMFILE.
// Owned by its own host uid, each sandbox has the host's per-user limits to
// itself, and host root's counts are untouched.
//
// The namespace is made by a process that runs as uid base: a clone of
// sandboxd that shares its memory and makes only system calls
// (userns_owner.c). It unshares a user namespace and waits while sandboxd
// (root) writes the id maps and opens the namespace. The returned file
// holds the namespace; the caller closes it.
func newUserns(base uint32) (*os.File, error) {
	var step C.int
	fd := C.skiff_userns_new(C.uint(base), C.uint(idRange), &step)
	if fd < 0 {
		return nil, fmt.Errorf("user namespace for uid %d: %s: %w", base, ownerSteps[step], syscall.Errno(-fd))
	}
	return os.NewFile(uintptr(fd), fmt.Sprintf("userns:%d", base)), nil
}
