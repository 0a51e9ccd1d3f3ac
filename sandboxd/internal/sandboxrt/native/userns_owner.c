//go:build cgo

// The owner of each sandbox's user namespace: see newUserns (idmap.go).
//
// A user namespace is owned by the effective uid of the process that makes
// it, and its id maps are written through a process inside it. So a
// process running as the sandbox's host uid makes it, and stays until
// sandboxd (root) has written the maps and opened the namespace.
//
// That process is a clone of the calling thread that shares sandboxd's
// memory and file table (CLONE_VM, CLONE_FILES) and runs, on a small stack
// of its own, nothing but system calls. Before, it was sandboxd's binary
// executed again, whose C constructor did the same before the Go runtime
// started: an exec of a 35 MB binary, and its dynamic linking, for every
// sandbox (3.7% of the host's CPU in a create-run-kill benchmark).
//
// The clone makes its system calls without errno (raw_syscall): it shares
// the calling thread's thread-local storage, errno included. It changes its
// own credentials only, with raw system calls (glibc's setresuid would
// change those of every thread of sandboxd). It makes the memory it shares
// with sandboxd "not dumpable" while it runs as the sandbox's uid, and the
// last clone to end sets sandboxd's setting back (owner_begin, owner_end).

#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "userns_owner.h"

static long raw_syscall(long n, long a, long b, long c, long d)
{
#if defined(__x86_64__)
	long ret;
	register long r10 __asm__("r10") = d;
	__asm__ volatile("syscall"
			 : "=a"(ret)
			 : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10)
			 : "rcx", "r11", "memory");
	return ret;
#elif defined(__aarch64__)
	register long x8 __asm__("x8") = n;
	register long x0 __asm__("x0") = a;
	register long x1 __asm__("x1") = b;
	register long x2 __asm__("x2") = c;
	register long x3 __asm__("x3") = d;
	__asm__ volatile("svc 0" : "+r"(x0) : "r"(x8), "r"(x1), "r"(x2), "r"(x3) : "memory", "cc");
	return x0;
#else
	/* Elsewhere through glibc, whose errno the two share: an error's
	 * errno may then be another's (it says only which step failed). */
	long r = syscall(n, a, b, c, d);
	return r == -1 ? -errno : r;
#endif
}

#define OWNER_STACK (64 * 1024)

/* What the caller and the clone share, at the bottom of the clone's stack. */
struct owner {
	unsigned int id;
	pid_t parent;
	int state;   /* 0 while the clone works; then 1, or -errno */
	int step;    /* the step that failed */
	int release; /* 1: the clone may exit */
};

static void futex_wait(int *addr, int val, long timeout_ms)
{
	struct timespec ts = {timeout_ms / 1000, (timeout_ms % 1000) * 1000000L};
	raw_syscall(SYS_futex, (long)addr, FUTEX_WAIT, val, timeout_ms > 0 ? (long)&ts : 0);
}

static void futex_wake(int *addr)
{
	raw_syscall(SYS_futex, (long)addr, FUTEX_WAKE, 1, 0);
}

static void owner_fail(struct owner *o, int step, long err)
{
	o->step = step;
	__atomic_store_n(&o->state, (int)err, __ATOMIC_RELEASE);
	futex_wake(&o->state);
}

static int owner_main(void *arg)
{
	struct owner *o = arg;
	long r;

	if ((r = raw_syscall(SYS_setgroups, 0, 0, 0, 0)) < 0) {
		owner_fail(o, SKIFF_USERNS_SETGROUPS, r);
		return 1;
	}
	if ((r = raw_syscall(SYS_setresgid, o->id, o->id, o->id, 0)) < 0) {
		owner_fail(o, SKIFF_USERNS_SETGID, r);
		return 1;
	}
	if ((r = raw_syscall(SYS_setresuid, o->id, o->id, o->id, 0)) < 0) {
		owner_fail(o, SKIFF_USERNS_SETUID, r);
		return 1;
	}
	/* Not dumpable, whatever fs.suid_dumpable made of the change of uid
	 * (owner_begin). */
	if ((r = raw_syscall(SYS_prctl, PR_SET_DUMPABLE, 0, 0, 0)) < 0) {
		owner_fail(o, SKIFF_USERNS_SETUID, r);
		return 1;
	}
	/* After the change of credentials, which clears it: gone with the
	 * calling thread, should sandboxd die meanwhile. */
	if ((r = raw_syscall(SYS_prctl, PR_SET_PDEATHSIG, SIGKILL, 0, 0)) < 0) {
		owner_fail(o, SKIFF_USERNS_PDEATHSIG, r);
		return 1;
	}
	if (raw_syscall(SYS_getppid, 0, 0, 0, 0) != o->parent)
		return 1;
	if ((r = raw_syscall(SYS_unshare, CLONE_NEWUSER, 0, 0, 0)) < 0) {
		owner_fail(o, SKIFF_USERNS_UNSHARE, r);
		return 1;
	}
	__atomic_store_n(&o->state, 1, __ATOMIC_RELEASE);
	futex_wake(&o->state);
	while (!__atomic_load_n(&o->release, __ATOMIC_ACQUIRE))
		futex_wait(&o->release, 0, 0);
	return 0;
}

static int write_map(pid_t pid, const char *name, const char *map, int len)
{
	char path[64];
	int fd, n;

	snprintf(path, sizeof(path), "/proc/%d/%s", pid, name);
	fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	n = write(fd, map, len);
	if (n != len) {
		int err = n < 0 ? -errno : -EIO;
		close(fd);
		return err;
	}
	close(fd);
	return 0;
}

/* sandboxd's own dumpable setting, and the clones alive. While one is, the
 * memory it shares with sandboxd stays not dumpable: the clone runs as a
 * sandbox's host uid, which must not be able to read or write that memory,
 * nor open sandboxd's files, through /proc. The last clone to end sets the
 * setting back. */
static pthread_mutex_t owners_mu = PTHREAD_MUTEX_INITIALIZER;
static int owners_alive;
static int dumpable = -1;

static void owner_begin(void)
{
	pthread_mutex_lock(&owners_mu);
	if (owners_alive++ == 0)
		dumpable = prctl(PR_GET_DUMPABLE, 0, 0, 0, 0);
	pthread_mutex_unlock(&owners_mu);
}

static void owner_end(void)
{
	pthread_mutex_lock(&owners_mu);
	if (--owners_alive == 0 && dumpable >= 0)
		prctl(PR_SET_DUMPABLE, dumpable, 0, 0, 0);
	pthread_mutex_unlock(&owners_mu);
}

int skiff_userns_new(unsigned int id, unsigned int count, int *step)
{
	char *stack, map[64], path[64];
	struct owner *o;
	sigset_t all, old;
	pid_t pid;
	int len, status, ret, state;

	*step = SKIFF_USERNS_CLONE;
	stack = mmap(NULL, OWNER_STACK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
	if (stack == MAP_FAILED)
		return -errno;
	o = (struct owner *)stack;
	o->id = id;
	o->parent = getpid();
	o->state = 0;
	o->release = 0;
	owner_begin();

	/* The clone starts with every signal blocked (Go's handlers are not
	 * for it), and exits with no signal to anyone (exit signal 0). */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	pid = clone(owner_main, stack + OWNER_STACK, CLONE_VM | CLONE_FILES, o);
	ret = pid < 0 ? -errno : 0;
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (pid < 0) {
		owner_end();
		munmap(stack, OWNER_STACK);
		return ret;
	}

	/* Wait for its answer; should it end without one, say so. */
	for (;;) {
		state = __atomic_load_n(&o->state, __ATOMIC_ACQUIRE);
		if (state != 0)
			break;
		if (waitpid(pid, &status, WNOHANG | __WALL) == pid) {
			pid = -1;
			*step = SKIFF_USERNS_UNSHARE;
			ret = -ECHILD;
			goto out;
		}
		futex_wait(&o->state, 0, 100);
	}
	if (state < 0) {
		*step = o->step;
		ret = state;
		goto out;
	}
	len = snprintf(map, sizeof(map), "0 %u %u\n", id, count);
	*step = SKIFF_USERNS_UIDMAP;
	if ((ret = write_map(pid, "uid_map", map, len)) < 0)
		goto out;
	*step = SKIFF_USERNS_GIDMAP;
	if ((ret = write_map(pid, "gid_map", map, len)) < 0)
		goto out;
	*step = SKIFF_USERNS_OPEN;
	snprintf(path, sizeof(path), "/proc/%d/ns/user", pid);
	ret = open(path, O_RDONLY | O_CLOEXEC);
	if (ret < 0)
		ret = -errno;

out:
	__atomic_store_n(&o->release, 1, __ATOMIC_RELEASE);
	if (pid > 0) {
		futex_wake(&o->release);
		while (waitpid(pid, &status, __WALL) < 0 && errno == EINTR)
			;
	}
	munmap(stack, OWNER_STACK);
	owner_end();
	return ret;
}
