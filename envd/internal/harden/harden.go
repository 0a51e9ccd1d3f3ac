// Package harden protects envd's own process from the sandbox it serves.
//
// envd holds what a sandbox must not reach: the host's log file on its
// stdout and stderr (whose limits envd enforces), its listening socket and
// the access token. Root in a sandbox lacks CAP_SYS_PTRACE, so once envd is
// not dumpable the kernel refuses that root ptrace(2) of envd and the
// /proc/<envd>/{fd,mem,environ,…} files, which would hand it all of these.
package harden

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// NonDumpable makes envd's process not dumpable (prctl PR_SET_DUMPABLE 0):
// no core dumps, its /proc/<pid> files owned by root, and ptrace(2) and
// those files refused to anyone without CAP_SYS_PTRACE. It covers every
// thread. The processes envd starts are unaffected: execve makes a program
// that is not set-user-ID or set-group-ID dumpable again.
func NonDumpable() error {
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("prctl PR_SET_DUMPABLE: %w", err)
	}
	return nil
}

// Dumpable returns the process's dumpable flag (prctl PR_GET_DUMPABLE):
// 0 not dumpable, 1 dumpable, 2 dumpable by root only.
func Dumpable() (int, error) {
	v, err := unix.PrctlRetInt(unix.PR_GET_DUMPABLE, 0, 0, 0, 0)
	if err != nil {
		return 0, fmt.Errorf("prctl PR_GET_DUMPABLE: %w", err)
	}
	return v, nil
}
