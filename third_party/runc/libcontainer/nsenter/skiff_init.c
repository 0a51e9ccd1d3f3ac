/*
 * skiff_init: a container's standard init done in C, by the init's stage 2,
 * so that the Go runtime never starts in it (Skiff, patch 0005).
 *
 * The parent (libcontainer, skiff_cinit.go) sends a plan in the bootstrap
 * data (SKIFF_INIT_PLAN_ATTR) only for a configuration whose every part is
 * done here; for any other it sends none and the Go init runs as always.
 * This does what linuxStandardInit.Init does for such a configuration, in
 * its order, and speaks the same synchronisation protocol with the parent
 * (procHooks/procHooksDone, procReady/procRun, procError, the exec fifo).
 *
 * Paths in the root are resolved with openat2(RESOLVE_IN_ROOT) and the
 * mounts made with the new mount API onto the descriptors found
 * (move_mount), so that no path is resolved again after it was checked.
 */

#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <grp.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/types.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/keyctl.h>
#include <linux/openat2.h>
#include <linux/seccomp.h>

#include "skiff_init.h"

/* The new mount API, by number (linux/mount.h clashes with sys/mount.h). */
#define SK_FSOPEN_CLOEXEC 0x1
#define SK_FSCONFIG_SET_FLAG 0
#define SK_FSCONFIG_SET_STRING 1
#define SK_FSCONFIG_CMD_CREATE 6
#define SK_FSMOUNT_CLOEXEC 0x1
#define SK_MOUNT_ATTR_RDONLY 0x1
#define SK_MOUNT_ATTR_NOSUID 0x2
#define SK_MOUNT_ATTR_NODEV 0x4
#define SK_MOUNT_ATTR_NOEXEC 0x8
#define SK_MOUNT_ATTR_NOATIME 0x10
#define SK_MOUNT_ATTR_STRICTATIME 0x20
#define SK_MOUNT_ATTR_NODIRATIME 0x80
#define SK_MOVE_MOUNT_F_EMPTY_PATH 0x4
#define SK_MOVE_MOUNT_T_EMPTY_PATH 0x40
#define SK_OPEN_TREE_CLONE 1
#define SK_AT_RECURSIVE 0x8000
#define SK_CLOSE_RANGE_CLOEXEC (1U << 2)

struct sk_mount_attr {
	uint64_t attr_set, attr_clr, propagation, userns_fd;
};

/* Plan entries: kept in step with skiff_cinit.go. */
enum {
	P_ROOTFS = 1,
	P_PROPAGATION = 2,
	P_MOUNT = 3,
	P_DEVICE = 4,
	P_MASK = 5,
	P_READONLY = 6,
	P_HOSTNAME = 7,
	P_CAPS = 8,
	P_USER = 9,
	P_GROUP = 10,
	P_SECCOMP = 11,
	P_ARG = 12,
	P_ENV = 13,
	P_CWD = 14,
	P_KEYRING = 15,
	P_NO_NEW_PRIVS = 16,
	P_PASSED_FILES = 17,
};

#define MAX_ITEMS 256

struct mnt {
	uint64_t flags;
	uint32_t bind;
	const char *src, *dst, *type, *data;
};

struct plan {
	const char *rootfs, *hostname, *cwd, *keyring;
	uint32_t keyring_perm;
	uint64_t propagation;
	struct mnt mounts[MAX_ITEMS];
	int nmounts;
	const char *devices[MAX_ITEMS], *masks[MAX_ITEMS], *readonly[MAX_ITEMS];
	int ndevices, nmasks, nreadonly;
	uint64_t caps[5];	/* bounding, effective, permitted, inheritable, ambient */
	uint32_t uid, gid;
	gid_t groups[MAX_ITEMS];
	int ngroups;
	const unsigned char *seccomp;
	uint32_t seccomp_len, seccomp_flags, seccomp_nnp;
	int has_seccomp;
	char *args[MAX_ITEMS + 1], *env[MAX_ITEMS + 1];
	int nargs, nenv;
	uint32_t no_new_privs, passed_files;
};

static int syncfd = -1;

/* procfd is the container's procfs (the mount made on its /proc), which
 * the init reads after pivot_root rather than whatever /proc the root
 * has by then. */
static int procfd = -1;

#define PROC_SUPER_MAGIC_ 0x9fa0

/* fail reports msg to the parent as a procError and exits. */
static void __attribute__((noreturn, format(printf, 1, 2))) fail(const char *format, ...)
{
	char msg[1024], out[2300];
	int saved = errno;
	va_list ap;

	va_start(ap, format);
	vsnprintf(msg, sizeof(msg), format, ap);
	va_end(ap);
	if (saved) {
		size_t n = strlen(msg);
		snprintf(msg + n, sizeof(msg) - n, ": %s", strerror(saved));
	}
	/* A JSON string: escape what needs it. */
	size_t o = 0;
	o += snprintf(out, sizeof(out), "{\"type\":\"procError\",\"flags\":0,\"arg\":{\"message\":\"");
	for (const char *p = msg; *p && o < sizeof(out) - 16; p++) {
		unsigned char c = (unsigned char)*p;
		if (c == '"' || c == '\\') {
			out[o++] = '\\';
			out[o++] = c;
		} else if (c < 0x20) {
			o += snprintf(out + o, sizeof(out) - o, "\\u%04x", c);
		} else {
			out[o++] = c;
		}
	}
	o += snprintf(out + o, sizeof(out) - o, "\"}}");
	if (syncfd >= 0)
		send(syncfd, out, o, MSG_NOSIGNAL);
	_exit(1);
}

static void sync_send(const char *type)
{
	char buf[128];
	int n = snprintf(buf, sizeof(buf), "{\"type\":\"%s\",\"flags\":0}", type);
	if (send(syncfd, buf, n, MSG_NOSIGNAL) != n)
		fail("writing sync %s", type);
}

static void sync_expect(const char *type)
{
	char buf[4096], want[128];
	ssize_t n = recv(syncfd, buf, sizeof(buf) - 1, 0);
	if (n == 0)
		errno = 0;
	if (n <= 0)
		fail("reading sync %s from parent", type);
	buf[n] = '\0';
	snprintf(want, sizeof(want), "\"type\":\"%s\"", type);
	if (strstr(buf, want) == NULL) {
		errno = 0;
		fail("unexpected synchronisation from parent: %s, expected %s", buf, type);
	}
}

static int envfd(const char *name)
{
	const char *v = getenv(name);
	char *end;
	long fd;

	if (v == NULL || *v == '\0')
		return -1;
	fd = strtol(v, &end, 10);
	if (*end != '\0' || fd < 0 || fd > INT_MAX) {
		errno = 0;
		fail("unable to convert %s", name);
	}
	return (int)fd;
}

/* need fails unless an entry of type t holds at least size bytes. */
static void need(uint32_t t, uint32_t n, uint32_t size)
{
	if (n < size)
		fail("init plan: entry %u of %u bytes, not %u", t, n, size);
}

/* str is the C string of n bytes at v: exactly one NUL, at its end. */
static char *str(uint32_t t, char *v, uint32_t n)
{
	need(t, n, 1);
	if (memchr(v, 0, n) != v + n - 1)
		fail("init plan: entry %u is not a string", t);
	return v;
}

/* next is the string after s, which ends before end. */
static const char *next(uint32_t t, const char *s, const char *end)
{
	const char *nul = memchr(s, 0, end - s);
	if (nul == NULL || nul + 1 >= end)
		fail("init plan: mount entry %u cut short", t);
	return nul + 1;
}

/* parse reads the plan: entries of u32 type, u32 length, payload padded to 4. */
static void parse(struct plan *p, char *data, size_t len)
{
	size_t off = 0;

	memset(p, 0, sizeof(*p));
	errno = 0;
	while (off + 8 <= len) {
		uint32_t type, n;
		memcpy(&type, data + off, 4);
		memcpy(&n, data + off + 4, 4);
		char *v = data + off + 8;
		if (n > len - off - 8)
			fail("init plan: entry %u overruns the plan", type);
		off += 8 + (((size_t)n + 3) & ~(size_t)3);
		switch (type) {
		case P_ROOTFS:
			p->rootfs = str(type, v, n);
			break;
		case P_PROPAGATION:
			need(type, n, 8);
			memcpy(&p->propagation, v, 8);
			break;
		case P_MOUNT:{
				if (p->nmounts == MAX_ITEMS)
					fail("init plan: too many mounts");
				need(type, n, 12 + 4);
				if (v[n - 1] != '\0')
					fail("init plan: mount entry not a string");
				struct mnt *m = &p->mounts[p->nmounts++];
				memcpy(&m->flags, v, 8);
				memcpy(&m->bind, v + 8, 4);
				m->src = v + 12;
				m->dst = next(type, m->src, v + n);
				m->type = next(type, m->dst, v + n);
				m->data = next(type, m->type, v + n);
				if (memchr(m->data, 0, v + n - m->data) != v + n - 1)
					fail("init plan: mount entry of more than four strings");
				break;
			}
		case P_DEVICE:
			if (p->ndevices == MAX_ITEMS)
				fail("init plan: too many devices");
			p->devices[p->ndevices++] = str(type, v, n);
			break;
		case P_MASK:
			if (p->nmasks == MAX_ITEMS)
				fail("init plan: too many masked paths");
			p->masks[p->nmasks++] = str(type, v, n);
			break;
		case P_READONLY:
			if (p->nreadonly == MAX_ITEMS)
				fail("init plan: too many read-only paths");
			p->readonly[p->nreadonly++] = str(type, v, n);
			break;
		case P_HOSTNAME:
			p->hostname = str(type, v, n);
			break;
		case P_CAPS:
			need(type, n, sizeof(p->caps));
			memcpy(p->caps, v, sizeof(p->caps));
			break;
		case P_USER:
			need(type, n, 8);
			memcpy(&p->uid, v, 4);
			memcpy(&p->gid, v + 4, 4);
			break;
		case P_GROUP:
			if (p->ngroups == MAX_ITEMS)
				fail("init plan: too many groups");
			need(type, n, 4);
			memcpy(&p->groups[p->ngroups++], v, 4);
			break;
		case P_SECCOMP:
			need(type, n, 8);
			memcpy(&p->seccomp_flags, v, 4);
			memcpy(&p->seccomp_nnp, v + 4, 4);
			p->seccomp = (const unsigned char *)v + 8;
			p->seccomp_len = n - 8;
			p->has_seccomp = 1;
			break;
		case P_ARG:
			if (p->nargs == MAX_ITEMS)
				fail("init plan: too many arguments");
			p->args[p->nargs++] = str(type, v, n);
			break;
		case P_ENV:
			if (p->nenv == MAX_ITEMS)
				fail("init plan: too many environment variables");
			p->env[p->nenv++] = str(type, v, n);
			break;
		case P_CWD:
			p->cwd = str(type, v, n);
			break;
		case P_KEYRING:
			need(type, n, 4 + 1);
			memcpy(&p->keyring_perm, v, 4);
			p->keyring = str(type, v + 4, n - 4);
			break;
		case P_NO_NEW_PRIVS:
			need(type, n, 4);
			memcpy(&p->no_new_privs, v, 4);
			break;
		case P_PASSED_FILES:
			need(type, n, 4);
			memcpy(&p->passed_files, v, 4);
			break;
		default:
			fail("init plan: unknown entry %u", type);
		}
	}
	if (p->rootfs == NULL || p->rootfs[0] != '/' || p->nargs == 0)
		fail("init plan: no absolute root, or no arguments");
}

static int openat2_(int dirfd, const char *path, uint64_t flags, uint64_t resolve)
{
	struct open_how how = {.flags = flags,.resolve = resolve };
	return (int)syscall(SYS_openat2, dirfd, path, &how, sizeof(how));
}

/*
 * in_root opens path (absolute, clean) in the root (an O_PATH descriptor),
 * making what is missing of it: directories, and the last component as a
 * directory or, when file is set, an empty file. Existing components resolve
 * as in the root (symlinks too, never out of it); those it makes are opened
 * without following any.
 */
static int in_root(int rootfd, const char *path, int file)
{
	const uint64_t resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS;
	int fd = openat2_(rootfd, path, O_PATH | O_CLOEXEC, resolve);
	if (fd >= 0 || errno != ENOENT)
		return fd;

	char buf[PATH_MAX];
	if (strlen(path) >= sizeof(buf))
		return errno = ENAMETOOLONG, -1;
	strcpy(buf, path);
	/* The longest prefix that exists: cut at each '/' from the end. */
	char *cut = buf + strlen(buf);
	int dirfd = -1;
	for (;;) {
		while (cut > buf && *cut != '/')
			cut--;
		if (cut == buf) {
			dirfd = fcntl(rootfd, F_DUPFD_CLOEXEC, 0);
			break;
		}
		*cut = '\0';
		dirfd = openat2_(rootfd, buf, O_PATH | O_CLOEXEC, resolve);
		*cut = '/';
		if (dirfd >= 0)
			break;
		if (errno != ENOENT)
			return -1;
		cut--;
	}
	if (dirfd < 0)
		return -1;
	/* Make the rest, one component at a time, from cut. */
	char *name = cut + 1;
	for (;;) {
		char *slash = strchr(name, '/');
		int last = slash == NULL;
		if (!last)
			*slash = '\0';
		if (*name != '\0') {
			if (last && file) {
				int f = openat(dirfd, name, O_CREAT | O_EXCL | O_NOFOLLOW | O_WRONLY | O_CLOEXEC, 0644);
				if (f >= 0)
					close(f);
				else if (errno != EEXIST)
					goto fail;
			} else if (mkdirat(dirfd, name, 0755) < 0 && errno != EEXIST) {
				goto fail;
			}
			fd = openat2_(dirfd, name, O_PATH | O_CLOEXEC, RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH);
			if (fd < 0)
				goto fail;
			close(dirfd);
			dirfd = fd;
		}
		if (last)
			return dirfd;
		name = slash + 1;
	}
 fail:
	{
		int saved = errno;
		close(dirfd);
		errno = saved;
	}
	return -1;
}

static uint64_t mount_attrs(uint64_t flags)
{
	uint64_t a = 0;
	if (flags & MS_RDONLY)
		a |= SK_MOUNT_ATTR_RDONLY;
	if (flags & MS_NOSUID)
		a |= SK_MOUNT_ATTR_NOSUID;
	if (flags & MS_NODEV)
		a |= SK_MOUNT_ATTR_NODEV;
	if (flags & MS_NOEXEC)
		a |= SK_MOUNT_ATTR_NOEXEC;
	if (flags & MS_NOATIME)
		a |= SK_MOUNT_ATTR_NOATIME;
	if (flags & MS_STRICTATIME)
		a |= SK_MOUNT_ATTR_STRICTATIME;
	if (flags & MS_NODIRATIME)
		a |= SK_MOUNT_ATTR_NODIRATIME;
	return a;
}

/* move_onto puts the detached mount mfd on target and closes mfd. */
static void move_onto(int mfd, int target, const char *what)
{
	if (syscall(SYS_move_mount, mfd, "", target, "", SK_MOVE_MOUNT_F_EMPTY_PATH | SK_MOVE_MOUNT_T_EMPTY_PATH) < 0)
		fail("mount %s", what);
	close(mfd);
}

/* bind_onto bind-mounts src (a path where the init stands) on target. */
static void bind_onto(const char *src, int target, uint64_t flags, const char *what)
{
	int tree = (int)syscall(SYS_open_tree, AT_FDCWD, src,
				SK_OPEN_TREE_CLONE | O_CLOEXEC | ((flags & MS_REC) ? SK_AT_RECURSIVE : 0));
	if (tree < 0)
		fail("bind %s on %s: open_tree", src, what);
	struct sk_mount_attr attr = {.attr_set = mount_attrs(flags) };
	if (attr.attr_set &&
	    syscall(SYS_mount_setattr, tree, "", AT_EMPTY_PATH | ((flags & MS_REC) ? SK_AT_RECURSIVE : 0), &attr,
		    sizeof(attr)) < 0)
		fail("bind %s on %s: mount_setattr", src, what);
	move_onto(tree, target, what);
}

/*
 * fs_mount makes a new filesystem of m, detached, or returns -1 with errno
 * (what failed in *what).
 */
static int fs_mount(const struct mnt *m, const char **what)
{
	int fs = (int)syscall(SYS_fsopen, m->type, SK_FSOPEN_CLOEXEC), mfd = -1;
	char data[1024];
	*what = "fsopen";
	if (fs < 0)
		return -1;
	*what = "source";
	if (m->src[0] && syscall(SYS_fsconfig, fs, SK_FSCONFIG_SET_STRING, "source", m->src, 0) < 0)
		goto out;
	*what = "options too long";
	if (strlen(m->data) >= sizeof(data)) {
		errno = E2BIG;
		goto out;
	}
	strcpy(data, m->data);
	*what = "an option";
	for (char *save = NULL, *opt = strtok_r(data, ",", &save); opt; opt = strtok_r(NULL, ",", &save)) {
		char *eq = strchr(opt, '=');
		int r;
		if (eq) {
			*eq = '\0';
			r = (int)syscall(SYS_fsconfig, fs, SK_FSCONFIG_SET_STRING, opt, eq + 1, 0);
		} else {
			r = (int)syscall(SYS_fsconfig, fs, SK_FSCONFIG_SET_FLAG, opt, NULL, 0);
		}
		if (r < 0)
			goto out;
	}
	/* mount(2)'s MS_RDONLY makes the filesystem read-only too, not only the mount. */
	*what = "ro";
	if ((m->flags & MS_RDONLY) && syscall(SYS_fsconfig, fs, SK_FSCONFIG_SET_FLAG, "ro", NULL, 0) < 0)
		goto out;
	*what = "create";
	if (syscall(SYS_fsconfig, fs, SK_FSCONFIG_CMD_CREATE, NULL, NULL, 0) < 0)
		goto out;
	*what = "fsmount";
	mfd = (int)syscall(SYS_fsmount, fs, SK_FSMOUNT_CLOEXEC, mount_attrs(m->flags));
 out:
	{
		int saved = errno;
		close(fs);
		errno = saved;
	}
	return mfd;
}

/* fs_onto mounts a new filesystem of m on target; keep, if set, gets a
 * descriptor of it. */
static void fs_onto(const struct mnt *m, int target, int *keep)
{
	const char *what;
	int mfd = fs_mount(m, &what);
	if (mfd < 0)
		fail("mount %s on %s: %s", m->type, m->dst, what);
	if (keep && (*keep = fcntl(mfd, F_DUPFD_CLOEXEC, 0)) < 0)
		fail("mount %s on %s: dup", m->type, m->dst);
	move_onto(mfd, target, m->dst);
}

/*
 * check_target refuses a mountpoint as the Go init's checkProcMount and
 * createOpenMountpoint do: the root itself, and, but for proc's own, the
 * root's /proc or anything on a procfs (the root's symlinks may point there).
 */
static void check_target(int rootfd, int target, const struct mnt *m, const struct stat *procdir)
{
	struct stat st, root;
	struct statfs sfs;
	if (fstat(target, &st) < 0 || fstat(rootfd, &root) < 0 || fstatfs(target, &sfs) < 0)
		fail("mountpoint %s", m->dst);
	errno = 0;
	if (st.st_dev == root.st_dev && st.st_ino == root.st_ino)
		fail("mountpoint %s is the top of the root", m->dst);
	if (strcmp(m->type, "proc") == 0)
		return;
	if (sfs.f_type == PROC_SUPER_MAGIC_ ||
	    (procdir && st.st_dev == procdir->st_dev && st.st_ino == procdir->st_ino))
		fail("%s cannot be mounted because it is inside /proc", m->dst);
}

static void do_mount(int rootfd, const struct mnt *m, const struct stat *procdir)
{
	int file = 0, target;
	if (m->bind) {
		struct stat st;
		if (stat(m->src, &st) < 0)
			fail("bind %s on %s: stat", m->src, m->dst);
		file = !S_ISDIR(st.st_mode);
	}
	if (strcmp(m->type, "proc") == 0) {
		/* The root's own /proc, a directory, no symlink on the way. */
		target = openat2_(rootfd, m->dst, O_PATH | O_DIRECTORY | O_CLOEXEC,
				  RESOLVE_IN_ROOT | RESOLVE_NO_SYMLINKS);
		if (target < 0 && errno == ENOENT)
			target = in_root(rootfd, m->dst, 0);
	} else {
		target = in_root(rootfd, m->dst, file);
	}
	if (target < 0)
		fail("mountpoint %s in the root", m->dst);
	check_target(rootfd, target, m, procdir);
	if (m->bind)
		bind_onto(m->src, target, m->flags, m->dst);
	else
		fs_onto(m, target, strcmp(m->type, "proc") == 0 && procfd < 0 ? &procfd : NULL);
	close(target);
}

static void setup_dev(int rootfd, const struct plan *p)
{
	int dev = in_root(rootfd, "/dev", 0);
	if (dev < 0)
		fail("open /dev in the root");
	/* An O_PATH descriptor cannot make entries: open it as a directory. */
	int devdir = openat(dev, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (devdir < 0)
		fail("open /dev in the root");
	close(dev);
	for (int i = 0; i < p->ndevices; i++) {
		const char *path = p->devices[i];
		if (strncmp(path, "/dev/", 5) != 0 || path[5] == '\0' || strchr(path + 5, '/') != NULL) {
			errno = 0;
			fail("init plan: device %s not right in /dev", path);
		}
		int f = openat(devdir, path + 5, O_CREAT | O_NOFOLLOW | O_RDONLY | O_CLOEXEC, 0);
		if (f < 0)
			fail("create device inode %s", path);
		close(f);
		int target = openat(devdir, path + 5, O_PATH | O_NOFOLLOW | O_CLOEXEC);
		if (target < 0)
			fail("create device inode %s", path);
		bind_onto(path, target, MS_BIND, path);
		close(target);
	}
	if (unlinkat(devdir, "ptmx", 0) < 0 && errno != ENOENT)
		fail("unlinkat /dev/ptmx");
	if (symlinkat("pts/ptmx", devdir, "ptmx") < 0)
		fail("symlinkat /dev/ptmx");
	static const char *links[][2] = {
		{"/proc/self/fd", "fd"}, {"/proc/self/fd/0", "stdin"},
		{"/proc/self/fd/1", "stdout"}, {"/proc/self/fd/2", "stderr"},
		{"/proc/kcore", "core"},
	};
	for (size_t i = 0; i < sizeof(links) / sizeof(links[0]); i++) {
		if (strcmp(links[i][1], "core") == 0 && access("/proc/kcore", F_OK) < 0)
			continue;
		if (symlinkat(links[i][0], devdir, links[i][1]) < 0 && errno != EEXIST)
			fail("symlinkat /dev/%s", links[i][1]);
	}
	close(devdir);
}

static void pivot(int rootfd)
{
	int oldroot = open("/", O_DIRECTORY | O_RDONLY | O_PATH | O_CLOEXEC);
	if (oldroot < 0)
		fail("open /");
	if (fchdir(rootfd) < 0)
		fail("chdir to the root");
	if (syscall(SYS_pivot_root, ".", ".") < 0)
		fail("pivot_root");
	if (fchdir(oldroot) < 0)
		fail("fchdir to the old root");
	if (mount("", ".", "", MS_SLAVE | MS_REC, NULL) < 0)
		fail("make the old root a slave");
	if (umount2(".", MNT_DETACH) < 0)
		fail("unmount the old root");
	if (chdir("/") < 0)
		fail("chdir /");
	close(oldroot);
}

static int is_dev_null(const struct stat *st)
{
	return S_ISCHR(st->st_mode) && st->st_rdev == makedev(1, 3);
}

static void reopen_dev_null(void)
{
	struct stat st;
	int fd = open("/dev/null", O_RDWR | O_CLOEXEC);
	if (fd < 0)
		fail("open /dev/null");
	if (fstat(fd, &st) < 0 || !is_dev_null(&st)) {
		errno = 0;
		fail("can't reopen /dev/null: not the null device");
	}
	for (int i = 0; i < 3; i++) {
		if (fstat(i, &st) < 0)
			fail("fstat fd %d", i);
		if (is_dev_null(&st) && dup3(fd, i, 0) < 0)
			fail("dup3 /dev/null");
	}
	close(fd);
}

static void mkdir_all(const char *path)
{
	char buf[PATH_MAX];
	errno = 0;
	if (strlen(path) >= sizeof(buf))
		fail("mkdir %s: too long", path);
	strcpy(buf, path);
	for (char *s = buf + 1;; s++) {
		if (*s == '/' || *s == '\0') {
			char c = *s;
			*s = '\0';
			if (mkdir(buf, 0755) < 0 && errno != EEXIST)
				fail("mkdir %s", buf);
			*s = c;
			if (c == '\0')
				break;
		}
	}
}

static void readonly_path(const char *path)
{
	struct statfs sfs;
	if (mount(path, path, "", MS_BIND | MS_REC, NULL) < 0) {
		if (errno == ENOENT)
			return;
		fail("can't make %s read-only: bind", path);
	}
	if (statfs(path, &sfs) < 0)
		fail("can't make %s read-only: statfs", path);
	unsigned long flags = sfs.f_flags & (MS_NOSUID | MS_NODEV | MS_NOEXEC);
	if (mount(path, path, "", flags | MS_BIND | MS_REMOUNT | MS_RDONLY, NULL) < 0)
		fail("can't make %s read-only: remount", path);
}

static void mask_paths(const struct plan *p)
{
	if (p->nmasks == 0)
		return;
	struct stat st;
	int devnull = open("/dev/null", O_PATH | O_CLOEXEC);
	if (devnull < 0 || fstat(devnull, &st) < 0)
		fail("can't mask paths: /dev/null");
	if (!is_dev_null(&st)) {
		errno = 0;
		fail("can't mask paths: /dev/null is not the null device");
	}
	for (int i = 0; i < p->nmasks; i++) {
		const char *path = p->masks[i];
		int fd = open(path, O_PATH | O_CLOEXEC);
		if (fd < 0) {
			if (errno == ENOENT)
				continue;
			fail("can't mask path %s", path);
		}
		if (fstat(fd, &st) < 0)
			fail("can't mask path %s", path);
		if (S_ISDIR(st.st_mode)) {
			/* maskDir: an empty read-only tmpfs, as small as can be
			 * (some kernels refuse one inode: then two). */
			struct mnt m = {.flags = MS_RDONLY,.type = "tmpfs",.src = "tmpfs",.dst = path,
				.data = "nr_blocks=1,nr_inodes=1"
			};
			const char *what;
			int mfd = fs_mount(&m, &what);
			if (mfd < 0 && errno == EINVAL) {
				m.data = "nr_blocks=1,nr_inodes=2";
				mfd = fs_mount(&m, &what);
			}
			if (mfd < 0)
				fail("can't mask dir %s: %s", path, what);
			move_onto(mfd, fd, path);
		} else {
			int tree = (int)syscall(SYS_open_tree, devnull, "",
						SK_OPEN_TREE_CLONE | O_CLOEXEC | AT_EMPTY_PATH);
			if (tree < 0)
				fail("can't mask path %s: open_tree /dev/null", path);
			move_onto(tree, fd, path);
		}
		close(fd);
	}
	close(devnull);
}

static void join_keyring(const char *name, uint32_t setbits)
{
	long id = syscall(SYS_keyctl, KEYCTL_JOIN_SESSION_KEYRING, name);
	if (id < 0) {
		if (errno == ENOSYS)
			return;
		fail("unable to join session keyring");
	}
	char desc[1024];
	long n = syscall(SYS_keyctl, KEYCTL_DESCRIBE, id, desc, sizeof(desc) - 1);
	if (n < 0)
		fail("unable to mod keyring permissions: describe");
	desc[n < (long)sizeof(desc) ? n : (long)sizeof(desc) - 1] = '\0';
	/* type;uid;gid;perm;description */
	char *f = desc;
	for (int i = 0; i < 3 && f; i++)
		if ((f = strchr(f, ';')))
			f++;
	if (f == NULL) {
		errno = 0;
		fail("unable to mod keyring permissions: %s", desc);
	}
	unsigned long perm = strtoul(f, NULL, 16);
	/* As runc's keys.ModKeyringPerm(id, 0xffffffff, setbits). */
	if (syscall(SYS_keyctl, KEYCTL_SETPERM, id, (uint32_t)perm | setbits) < 0)
		fail("unable to mod keyring permissions");
}

/* last_cap is the kernel's last capability, probed as moby/sys/capability
 * does (no file of the root's to trust). */
static int last_cap(void)
{
	int c = 0;
	while (c < 64 && prctl(PR_CAPBSET_READ, c, 0, 0, 0) >= 0)
		c++;
	if (c == 0 || c == 64) {
		errno = 0;
		fail("cannot find the last capability (%d)", c - 1);
	}
	return c - 1;
}

static void apply_bounding(uint64_t bounding, int last)
{
	for (int c = 0; c <= last && c < 64; c++) {
		if (bounding & (1ULL << c))
			continue;
		if (prctl(PR_CAPBSET_DROP, c, 0, 0, 0) < 0 && errno != EINVAL)
			fail("unable to apply bounding set");
	}
}

static void apply_caps(const struct plan *p, int last)
{
	struct __user_cap_header_struct hdr = {.version = _LINUX_CAPABILITY_VERSION_3,.pid = 0 };
	struct __user_cap_data_struct data[2];
	/* The bounding set was applied before the user was set (as runc's
	 * ApplyCaps applies it again only while it holds CAP_SETPCAP, which a
	 * user other than root no longer does; root's is unchanged). */
	for (int i = 0; i < 2; i++) {
		data[i].effective = (uint32_t)(p->caps[1] >> (32 * i));
		data[i].permitted = (uint32_t)(p->caps[2] >> (32 * i));
		data[i].inheritable = (uint32_t)(p->caps[3] >> (32 * i));
	}
	if (syscall(SYS_capset, &hdr, data) < 0)
		fail("can't apply capabilities");
	if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0 && errno != EINVAL)
		fail("can't clear ambient capabilities");
	for (int c = 0; c <= last && c < 64; c++)
		if (p->caps[4] & (1ULL << c))
			prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, c, 0, 0);	/* runc only warns */
}

static void setup_user(const struct plan *p)
{
	/* fixStdioPermissions */
	for (int i = 0; i < 3; i++) {
		struct stat st;
		if (fstat(i, &st) < 0)
			fail("fstat fd %d", i);
		if (st.st_uid == p->uid || is_dev_null(&st))
			continue;
		if (fchown(i, p->uid, -1) < 0 && errno != EPERM && errno != EROFS)
			fail("fchown fd %d", i);
	}
	char sg[16] = "";
	int fd = openat(procfd, "self/setgroups", O_RDONLY | O_CLOEXEC);
	if (fd >= 0) {
		ssize_t n = read(fd, sg, sizeof(sg) - 1);
		sg[n > 0 ? n : 0] = '\0';
		close(fd);
	} else if (errno != ENOENT) {
		fail("open /proc/self/setgroups");
	}
	if (strncmp(sg, "deny", 4) != 0 && syscall(SYS_setgroups, p->ngroups, p->groups) < 0)
		fail("setgroups");
	if (syscall(SYS_setresgid, p->gid, p->gid, p->gid) < 0) {
		if (errno == EINVAL)
			fail("cannot setgid to unmapped gid %u in user namespace", p->gid);
		fail("setgid");
	}
	if (syscall(SYS_setresuid, p->uid, p->uid, p->uid) < 0) {
		if (errno == EINVAL)
			fail("cannot setuid to unmapped uid %u in user namespace", p->uid);
		fail("setuid");
	}
}

static void load_seccomp(const struct plan *p)
{
	size_t size = sizeof(struct sock_filter);
	if (p->seccomp_len == 0 || p->seccomp_len % size != 0 || p->seccomp_len / size > 0xffff) {
		errno = 0;
		fail("compiled seccomp filter of %u bytes: not a program", p->seccomp_len);
	}
	struct sock_filter *filter = malloc(p->seccomp_len);
	if (filter == NULL)
		fail("seccomp filter");
	memcpy(filter, p->seccomp, p->seccomp_len);
	struct sock_fprog prog = {.len = (unsigned short)(p->seccomp_len / size),.filter = filter };
	if (p->seccomp_nnp && prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
		fail("error enabling no_new_privs bit");
	if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, p->seccomp_flags, &prog) < 0)
		fail("error loading seccomp filter");
	free(filter);
}

/*
 * close_from closes, or marks close-on-exec, every descriptor from min:
 * close_range(2), else one by one up to the limit, as runc falls back.
 */
static void close_from(unsigned int min, int cloexec)
{
	if (syscall(SYS_close_range, min, ~0U, cloexec ? SK_CLOSE_RANGE_CLOEXEC : 0) == 0)
		return;
	long max = sysconf(_SC_OPEN_MAX);
	if (max < 0 || max > 1 << 20)
		max = 1 << 20;
	for (long fd = min; fd < max; fd++) {
		if (cloexec) {
			int f = fcntl(fd, F_GETFD);
			if (f >= 0)
				fcntl(fd, F_SETFD, f | FD_CLOEXEC);
		} else {
			close(fd);
		}
	}
}

void skiff_init(char *data, size_t len, int rootfs_tree)
{
	struct plan *p = calloc(1, sizeof(struct plan));
	int parent_pid = getppid();

	syncfd = envfd("_LIBCONTAINER_SYNCPIPE");
	if (syncfd < 0) {
		errno = 0;
		fail("no _LIBCONTAINER_SYNCPIPE");
	}
	if (p == NULL)
		fail("init plan");
	int initpipe = envfd("_LIBCONTAINER_INITPIPE");
	int logpipe = envfd("_LIBCONTAINER_LOGPIPE");
	int fifofd = envfd("_LIBCONTAINER_FIFOFD");
	if (fifofd < 0) {
		errno = 0;
		fail("no _LIBCONTAINER_FIFOFD");
	}
	/*
	 * Wait for the parent's line that says go, as the Go init waits for
	 * its configuration: the parent is then done with what it does
	 * while the init lives (its pipes' names, the mount namespace), and
	 * an error of ours reaches it as an error, not as a missing process.
	 */
	if (initpipe < 0) {
		errno = 0;
		fail("no _LIBCONTAINER_INITPIPE");
	}
	for (;;) {
		char c;
		ssize_t n = read(initpipe, &c, 1);
		if (n == 1 && c == '\n')
			break;
		if (n == 0 || (n < 0 && errno != EINTR)) {
			if (n == 0)
				errno = 0;
			fail("waiting for the parent to start the init");
		}
	}
	close(initpipe);
	parse(p, data, len);
	clearenv();
	/* Before anything of the root's can be in the way. */
	int last = last_cap();

	if (p->keyring)
		join_keyring(p->keyring, p->keyring_perm);

	/*
	 * The root, when this mount namespace was made from a base one that
	 * does not have it: the copy stage 1 made of it, attached where it
	 * was.
	 */
	if (rootfs_tree >= 0) {
		if (syscall(SYS_move_mount, rootfs_tree, "", AT_FDCWD, p->rootfs, SK_MOVE_MOUNT_F_EMPTY_PATH) < 0)
			fail("attach the root at %s", p->rootfs);
		close(rootfs_tree);
	}

	/* prepareRoot */
	if (mount("", "/", "", p->propagation ? p->propagation : MS_SLAVE | MS_REC, NULL) < 0)
		fail("mount / with the root's propagation");
	{
		/* rootfsParentMountPropagation: the mount the root is on. */
		unsigned long flags = (p->propagation & MS_SLAVE) ? MS_SLAVE : MS_PRIVATE;
		char path[PATH_MAX];
		if (strlen(p->rootfs) >= sizeof(path))
			fail("rootfs path too long");
		strcpy(path, p->rootfs);
		while (mount("", path, "", flags, NULL) < 0) {
			char *slash = strrchr(path, '/');
			if (errno != EINVAL || strcmp(path, "/") == 0)
				fail("remount-propagation %s", path);
			if (slash == path)
				slash[1] = '\0';
			else
				*slash = '\0';
		}
	}
	if (mount(p->rootfs, p->rootfs, "bind", MS_BIND | MS_REC, NULL) < 0)
		fail("bind mount the root on itself");
	int rootfd = open(p->rootfs, O_DIRECTORY | O_PATH | O_CLOEXEC);
	if (rootfd < 0)
		fail("open rootfs handle");

	/* The root's own /proc, under which nothing but proc is mounted. */
	struct stat procdir;
	int pd = openat2_(rootfd, "proc", O_PATH | O_CLOEXEC, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS);
	int have_procdir = pd >= 0 && fstat(pd, &procdir) == 0;
	if (pd >= 0)
		close(pd);
	for (int i = 0; i < p->nmounts; i++)
		do_mount(rootfd, &p->mounts[i], have_procdir ? &procdir : NULL);
	if (procfd < 0) {
		errno = 0;
		fail("init plan: no proc mounted");
	}
	setup_dev(rootfd, p);

	sync_send("procHooks");
	sync_expect("procHooksDone");

	pivot(rootfd);
	close(rootfd);
	reopen_dev_null();
	if (p->cwd && p->cwd[0])
		mkdir_all(p->cwd);
	umask(022);

	if (p->hostname && sethostname(p->hostname, strlen(p->hostname)) < 0)
		fail("sethostname");
	for (int i = 0; i < p->nreadonly; i++)
		readonly_path(p->readonly[i]);
	mask_paths(p);

	int pdeath = 0;
	if (prctl(PR_GET_PDEATHSIG, &pdeath, 0, 0, 0) < 0)
		fail("can't get pdeath signal");
	if (p->no_new_privs && prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
		fail("prctl(SET_NO_NEW_PRIVS)");

	sync_send("procReady");
	sync_expect("procRun");

	if (p->has_seccomp && !p->no_new_privs)
		load_seccomp(p);

	/* finalizeNamespace */
	close_from(3 + p->passed_files, 1);
	int chdir_later = 0;
	if (p->cwd && p->cwd[0] && chdir(p->cwd) < 0) {
		if (errno != EACCES && errno != EPERM)
			fail("chdir to cwd (%s) set in config.json failed", p->cwd);
		chdir_later = 1;
	}
	apply_bounding(p->caps[0], last);
	if (prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0) < 0)
		fail("unable to set keep caps");
	setup_user(p);
	if (chdir_later && chdir(p->cwd) < 0)
		fail("chdir to cwd (%s) set in config.json failed", p->cwd);
	char wd[PATH_MAX];
	if (getcwd(wd, sizeof(wd)) == NULL) {
		if (errno == ENOENT)
			fail("current working directory is outside of container mount namespace root -- possible container breakout detected");
		fail("failed to verify if current working directory is safe");
	}
	if (wd[0] != '/') {
		errno = 0;
		fail("current working directory is not absolute -- possible container breakout detected: cwd is %s", wd);
	}
	if (prctl(PR_SET_KEEPCAPS, 0, 0, 0, 0) < 0)
		fail("unable to clear keep caps");
	apply_caps(p, last);
	if (pdeath && prctl(PR_SET_PDEATHSIG, pdeath, 0, 0, 0) < 0)
		fail("can't restore pdeath signal");

	if (getppid() != parent_pid) {
		kill(getpid(), SIGKILL);
		_exit(1);
	}
	/* exec.LookPath of an absolute path. */
	struct stat st;
	if (stat(p->args[0], &st) < 0)
		fail("exec: %s", p->args[0]);
	if (S_ISDIR(st.st_mode)) {
		errno = EACCES;
		fail("exec: %s", p->args[0]);
	}
	if (faccessat(AT_FDCWD, p->args[0], X_OK, AT_EACCESS) < 0)
		fail("exec: %s", p->args[0]);

	if (p->has_seccomp && p->no_new_privs)
		load_seccomp(p);

	/* The parent reads the sync socket to its end: close it, and the log. */
	close(syncfd);
	syncfd = -1;
	if (logpipe >= 0)
		close(logpipe);

	/* From here the parent hears no error: it waits on the fifo. */
	char fifo[64];
	snprintf(fifo, sizeof(fifo), "self/fd/%d", fifofd);
	int w = openat(procfd, fifo, O_WRONLY | O_CLOEXEC);
	if (w < 0 || write(w, "0", 1) != 1) {
		fprintf(stderr, "init: write exec fifo: %s\n", strerror(errno));
		_exit(1);
	}
	close(w);
	close(fifofd);

	close_from(3 + p->passed_files, 0);
	p->args[p->nargs] = NULL;
	p->env[p->nenv] = NULL;
	execve(p->args[0], p->args, p->env);
	fprintf(stderr, "exec %s: %s\n", p->args[0], strerror(errno));
	_exit(127);
}
