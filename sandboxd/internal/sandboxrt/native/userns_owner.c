//go:build cgo

// The user namespace owner: see userns.go. This runs before the Go runtime
// starts, while the process has one thread, which unshare(CLONE_NEWUSER)
// requires and a Go program never has.

#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

__attribute__((constructor)) static void skiff_userns_owner(void)
{
	char status[16], c;
	int n;

	if (getenv("_SKIFF_USERNS_OWNER") == NULL)
		return;
	/* "ok", or the errno of unshare, as one line on stdout. */
	if (unshare(CLONE_NEWUSER) == 0)
		n = snprintf(status, sizeof(status), "ok\n");
	else
		n = snprintf(status, sizeof(status), "%d\n", errno);
	if (write(1, status, n) != n)
		_exit(1);
	/* Stay, holding the namespace, until sandboxd closes stdin. */
	for (;;) {
		ssize_t r = read(0, &c, 1);
		if (r == 0 || (r < 0 && errno != EINTR))
			_exit(0);
	}
}
