//go:build amd64 || arm64

package asuser

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The calling thread's identity, through raw system calls that change only
// that thread. On amd64 and arm64 these calls take 32-bit ids (on 386 and
// arm they would be the 16-bit ones: this file does not build there).

// noID is (uid_t)-1: setfsuid(-1) and setfsgid(-1) change nothing and
// return the current value.
const noID = ^uint32(0)

// haveFSIDs tells whether the kernel has setfsuid and setfsgid. gVisor's
// does not (ENOSYS, gvisor.dev/issue/260): there the thread's effective
// ids stand in for them, through setresuid and setresgid, which also act
// on the calling thread only. The real and saved ids stay envd's (0), so
// the thread can take its identity back, and its effective capabilities,
// cleared while its euid is not 0, come back from its permitted ones.
var haveFSIDs = func() bool {
	_, _, errno := unix.RawSyscall(unix.SYS_SETFSUID, uintptr(noID), 0, 0)
	return errno != unix.ENOSYS
}()

func fsuid() uint32 {
	if !haveFSIDs {
		return effectiveID(unix.SYS_GETRESUID)
	}
	r, _, _ := unix.RawSyscall(unix.SYS_SETFSUID, uintptr(noID), 0, 0)
	return uint32(r)
}

func fsgid() uint32 {
	if !haveFSIDs {
		return effectiveID(unix.SYS_GETRESGID)
	}
	r, _, _ := unix.RawSyscall(unix.SYS_SETFSGID, uintptr(noID), 0, 0)
	return uint32(r)
}

// effectiveID is the thread's effective uid (getresuid) or gid
// (getresgid).
func effectiveID(trap uintptr) uint32 {
	var r, e, s uint32
	if _, _, errno := unix.RawSyscall(trap, uintptr(unsafe.Pointer(&r)), uintptr(unsafe.Pointer(&e)), uintptr(unsafe.Pointer(&s))); errno != 0 {
		return noID
	}
	return e
}

// setFSUID sets the thread's fsuid. setfsuid(2) reports no error, only the
// previous value, so the result is read back.
func setFSUID(uid uint32) error {
	if !haveFSIDs {
		_, _, _ = unix.RawSyscall(unix.SYS_SETRESUID, uintptr(noID), uintptr(uid), uintptr(noID))
	} else {
		_, _, _ = unix.RawSyscall(unix.SYS_SETFSUID, uintptr(uid), 0, 0)
	}
	if got := fsuid(); got != uid {
		return fmt.Errorf("%w: setfsuid %d: the thread's fsuid is %d", ErrSwitch, uid, got)
	}
	return nil
}

// setFSGID sets the thread's fsgid, read back as for setFSUID.
func setFSGID(gid uint32) error {
	if !haveFSIDs {
		_, _, _ = unix.RawSyscall(unix.SYS_SETRESGID, uintptr(noID), uintptr(gid), uintptr(noID))
	} else {
		_, _, _ = unix.RawSyscall(unix.SYS_SETFSGID, uintptr(gid), 0, 0)
	}
	if got := fsgid(); got != gid {
		return fmt.Errorf("%w: setfsgid %d: the thread's fsgid is %d", ErrSwitch, gid, got)
	}
	return nil
}

// setGroups sets the thread's supplementary groups.
func setGroups(groups []uint32) error {
	var p unsafe.Pointer
	if len(groups) > 0 {
		p = unsafe.Pointer(&groups[0])
	}
	if _, _, errno := unix.RawSyscall(unix.SYS_SETGROUPS, uintptr(len(groups)), uintptr(p), 0); errno != 0 {
		return fmt.Errorf("%w: setgroups %v: %s", ErrSwitch, groups, errno.Error())
	}
	return nil
}

// getGroups returns the thread's supplementary groups.
func getGroups() ([]uint32, error) {
	n, _, errno := unix.RawSyscall(unix.SYS_GETGROUPS, 0, 0, 0)
	if errno != 0 {
		return nil, fmt.Errorf("%w: getgroups: %s", ErrSwitch, errno.Error())
	}
	if n == 0 {
		return nil, nil
	}
	groups := make([]uint32, n)
	// No other thread changes this one's groups between the two calls.
	n, _, errno = unix.RawSyscall(unix.SYS_GETGROUPS, n, uintptr(unsafe.Pointer(&groups[0])), 0)
	if errno != 0 {
		return nil, fmt.Errorf("%w: getgroups: %s", ErrSwitch, errno.Error())
	}
	return groups[:n], nil
}
