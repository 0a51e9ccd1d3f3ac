package native

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// cInitUnavailable names the system calls the init in C (our runc fork's
// patch 0005) uses that this process cannot make (a kernel older than
// 5.12, or a seccomp profile around sandboxd that refuses them), each with
// its error; nil when it can make them all. A sandbox's init inherits
// sandboxd's filter, so what sandboxd cannot make the init cannot either.
func cInitUnavailable() []error {
	var out []error
	// want records call's error unless it is ok: nil for the calls that
	// must succeed, EBADF for those given no descriptor.
	want := func(call string, err, ok error) {
		if !errors.Is(err, ok) && (ok != nil || err != nil) {
			out = append(out, fmt.Errorf("%s: %w", call, err))
		}
	}
	fd, err := unix.Openat2(unix.AT_FDCWD, "/", &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: unix.RESOLVE_IN_ROOT})
	if err == nil {
		_ = unix.Close(fd)
	}
	want("openat2", err, nil)
	fd, err = unix.Fsopen("tmpfs", unix.FSOPEN_CLOEXEC)
	want("fsopen", err, nil)
	if err == nil {
		want("fsconfig", unix.FsconfigSetFlag(fd, "ro"), nil)
		_ = unix.Close(fd)
	}
	_, err = unix.Fsmount(-1, unix.FSMOUNT_CLOEXEC, 0)
	want("fsmount", err, unix.EBADF)
	_, err = unix.OpenTree(-1, "", unix.OPEN_TREE_CLOEXEC|unix.AT_EMPTY_PATH)
	want("open_tree", err, unix.EBADF)
	want("move_mount", unix.MoveMount(-1, "", -1, "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH), unix.EBADF)
	// Nothing to change is done at once.
	want("mount_setattr", unix.MountSetattr(-1, "", unix.AT_EMPTY_PATH, &unix.MountAttr{}), nil)
	return out
}
