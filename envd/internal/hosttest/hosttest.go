// Package hosttest keeps tests that run envd's file operations as root away
// from the homes of the machine they run on. A path that resolves to a home
// (an empty or relative path, "~", a user's default directory) must never
// reach the host's: an earlier test removed /root that way.
//
// A fuzz run (go test -fuzz) keeps the inputs it finds in go's fuzz cache,
// under the home (the -test.fuzzcachedir go test passes): that one folder
// is the host's inside too, bound over the tmpfs, so that the next run
// starts from them as it would outside.
//
// Run, called from TestMain, runs the package's tests again in a mount
// namespace of their own, where /root and /home are empty tmpfs mounts,
// under slave propagation: nothing a test mounts there is seen outside, and
// what the host unmounts meanwhile (a sandbox's mounts, on a machine that
// runs sandboxd) is unmounted inside too, not kept alive by a private copy. It is
// the whole process that moves: unshare(CLONE_NEWNS) from Go would move only
// the calling OS thread, and envd's handlers run on others.
package hosttest

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// markerEnv is set, to the pid of the process outside, in the environment of
// the test binary run inside the namespace.
const markerEnv = "SKIFF_HOSTTEST_OUTSIDE_PID"

// homes are the folders hidden behind an empty tmpfs, where they exist.
var homes = []string{"/root", "/home"}

// tmpfsSize bounds what a stray write into a hidden home can take of the
// machine's memory.
const tmpfsSize = "64m"

// keepEnv names, in setup's environment, a folder of the host that stays
// the host's inside (the fuzz cache), whether or not a tmpfs hides the
// home it is in.
const keepEnv = "SKIFF_HOSTTEST_KEEP"

// setup runs inside the new mount namespace, as `sh -c setup sh <binary>
// <args>...`: it mounts the tmpfs and execs the test binary. The folder
// kept is opened before the tmpfs hides it and bound, by that descriptor,
// at its own path on top (-c: mount would otherwise resolve the path anew,
// into the tmpfs).
var setup = `set -e
keep="$` + keepEnv + `"
[ -z "$keep" ] || exec 3<"$keep"
for d in ` + strings.Join(homes, " ") + `; do
	if [ -d "$d" ]; then
		mode=0755
		[ "$d" = /root ] && mode=0700
		mount -t tmpfs -o "mode=$mode,size=` + tmpfsSize + `,nosuid,nodev" hosttest "$d"
	fi
done
if [ -n "$keep" ]; then
	mkdir -p "$keep"
	mount -c --bind /proc/self/fd/3 "$keep"
	exec 3<&-
fi
exec "$@"`

// fuzzCacheDir is the folder go test keeps a fuzz target's inputs in, as it
// passes it to the test binary (-test.fuzzcachedir=DIR); "" when it passed
// none (no -fuzz).
func fuzzCacheDir(args []string) string {
	for i, a := range args {
		name, value, eq := strings.Cut(strings.TrimPrefix(a, "-"), "=")
		if name != "-test.fuzzcachedir" && name != "test.fuzzcachedir" {
			continue
		}
		if eq {
			return value
		}
		if i+1 < len(args) {
			return args[i+1]
		}
	}
	return ""
}

// Outside reports whether Run would run the tests again in a namespace of
// their own rather than here: the process runs as root and is not that run.
// What TestMain does before Run while Outside holds happens in the host's
// mount namespace, with the homes visible (go build needs its caches there).
func Outside() bool {
	return os.Geteuid() == 0 && os.Getenv(markerEnv) == ""
}

// Run runs m's tests and returns the exit code for os.Exit. As root, it runs
// the test binary again (the same arguments) under `unshare --mount
// --propagation slave`, which mounts the tmpfs and runs the tests, and
// returns its exit code; that run's own Run checks that the homes are hidden
// before it runs the tests. Not as root, it runs them here, as they are.
func Run(m *testing.M) int {
	if Outside() {
		return reexec()
	}
	if os.Getenv(markerEnv) != "" {
		if err := check(); err != nil {
			fmt.Fprintln(os.Stderr, "hosttest: the homes are not hidden, not running the tests:", err)
			return 1
		}
	}
	return m.Run()
}

// Main is os.Exit(Run(m)), for a TestMain with nothing else to do.
func Main(m *testing.M) {
	os.Exit(Run(m))
}

// reexec runs the test binary inside a new mount namespace and returns its
// exit code.
func reexec() int {
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		fmt.Fprintln(os.Stderr, "hosttest: tests that run as root need unshare (util-linux) to hide the homes:", err)
		return 1
	}
	args := append([]string{"--mount", "--propagation", "slave", "--", "/bin/sh", "-c", setup, "sh"}, os.Args...)
	cmd := exec.Command(unshare, args...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), markerEnv+"="+strconv.Itoa(os.Getpid()))
	if dir := fuzzCacheDir(os.Args[1:]); dir != "" {
		// Made here, where it is seen: setup opens it before the tmpfs.
		if err := os.MkdirAll(dir, 0o755); err != nil {
			fmt.Fprintln(os.Stderr, "hosttest: the fuzz cache:", err)
			return 1
		}
		cmd.Env = append(cmd.Env, keepEnv+"="+dir)
	}
	// The child dies with this thread: when go test kills this process at
	// its timeout, the tests inside do not run on.
	runtime.LockOSThread()
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	// go test sends SIGQUIT at its timeout for the goroutines' stacks: those
	// of the tests, inside. Interrupts go there too.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGQUIT)
	defer signal.Stop(sigs)
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "hosttest:", err)
		return 1
	}
	go func() {
		for s := range sigs {
			_ = cmd.Process.Signal(s)
		}
	}()
	err = cmd.Wait()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee) && ee.ExitCode() >= 0:
		return ee.ExitCode()
	default:
		fmt.Fprintln(os.Stderr, "hosttest: the tests in their mount namespace:", err)
		return 1
	}
}

// outsidePID is the pid of the process that ran this one in its namespace.
func outsidePID() (int, error) {
	v := os.Getenv(markerEnv)
	pid, err := strconv.Atoi(v)
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("%s=%q is not a pid", markerEnv, v)
	}
	return pid, nil
}

// check verifies, inside, that this process is in a mount namespace other
// than the one outside, and that every home that exists there is a tmpfs
// of its own that does not propagate outside: so that a marker set by hand is no way
// around the guard.
func check() error {
	pid, err := outsidePID()
	if err != nil {
		return err
	}
	self, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		return fmt.Errorf("own mount namespace: %w", err)
	}
	outside, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid))
	if err != nil {
		return fmt.Errorf("mount namespace of pid %d outside: %w", pid, err)
	}
	if self == outside {
		return fmt.Errorf("still in the mount namespace outside (%s)", self)
	}
	mounts, err := mountInfo("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	for _, d := range homes {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d/root%s", pid, d)); err != nil {
			continue // no such home outside: nothing to hide
		}
		var st unix.Statfs_t
		if err := unix.Statfs(d, &st); err != nil {
			return fmt.Errorf("statfs %s: %w", d, err)
		}
		if st.Type != unix.TMPFS_MAGIC {
			return fmt.Errorf("%s is not a tmpfs (filesystem type %#x)", d, st.Type)
		}
		m, ok := mounts[d]
		if !ok {
			return fmt.Errorf("%s is not a mount point", d)
		}
		if m.shared {
			return fmt.Errorf("%s is a shared mount: it would propagate", d)
		}
	}
	return nil
}

// mount is one line of a mountinfo file.
type mount struct {
	dev    string // major:minor of the mounted filesystem
	fstype string
	shared bool // has a shared:N peer group (propagates to its peers)
}

// mountInfo reads a mountinfo file (proc(5)), keyed by mount point; the last
// mount on a point, the one on top, wins.
func mountInfo(path string) (map[string]mount, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := make(map[string]mount)
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		sep := -1
		for i, f := range fields {
			if f == "-" {
				sep = i
				break
			}
		}
		if sep < 6 || sep+1 >= len(fields) {
			continue
		}
		m := mount{dev: fields[2], fstype: fields[sep+1]}
		for _, opt := range fields[6:sep] {
			if strings.HasPrefix(opt, "shared:") {
				m.shared = true
			}
		}
		out[unescape(fields[4])] = m
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return out, nil
}

// unescape undoes mountinfo's octal escapes (\040 for a space and the like).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
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
