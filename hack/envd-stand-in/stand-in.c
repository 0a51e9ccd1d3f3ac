// envd's stand-in: what a sandbox costs when its init is not a Go program.
//
// skiff-bench lifecycle --cmd "" --sandboxd-arg=--envd=/tmp/stand-in runs
// sandboxes whose init is this instead of envd: it prints a version (as
// `envd --version` does), serves HTTP on the socket sandboxd hands it
// (--listen-fd N) or on --port, answers every request with 204 (so
// sandboxd's /health and /init pass), and exits on SIGTERM. It runs no
// commands: a lifecycle with it measures the sandbox's own making and
// ending. Not a part of Skiff.
//
//   gcc -O2 -static -o /tmp/stand-in hack/envd-stand-in/stand-in.c
#define _GNU_SOURCE
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

static void leave(int sig) { (void)sig; _exit(0); }

// serve answers the requests of one connection until it closes.
static void serve(int c) {
	static const char answer[] = "HTTP/1.1 204 No Content\r\nX-Envd-Version: 0.6.4\r\n\r\n";
	char buf[16384];
	size_t have = 0;
	for (;;) {
		char *end = have ? memmem(buf, have, "\r\n\r\n", 4) : NULL;
		if (!end) {
			if (have == sizeof buf) return;
			ssize_t n = read(c, buf + have, sizeof buf - have);
			if (n <= 0) return;
			have += (size_t)n;
			continue;
		}
		size_t head = (size_t)(end - buf) + 4, body = 0;
		for (char *p = buf; p < end; p++)
			if ((p == buf || p[-1] == '\n') && strncasecmp(p, "content-length:", 15) == 0)
				body = strtoul(p + 15, NULL, 10);
		// Drop the head and the body (read on when it has not all come).
		size_t drop = head + body;
		if (have >= drop) {
			memmove(buf, buf + drop, have - drop);
			have -= drop;
		} else {
			for (drop -= have, have = 0; drop > 0;) {
				ssize_t n = read(c, buf, drop < sizeof buf ? drop : sizeof buf);
				if (n <= 0) return;
				drop -= (size_t)n;
			}
		}
		if (write(c, answer, sizeof answer - 1) < 0) return;
	}
}

int main(int argc, char **argv) {
	int fd = -1, port = 49983;
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--version") == 0) {
			puts("0.6.4");
			return 0;
		}
		if (i + 1 < argc && strcmp(argv[i], "--listen-fd") == 0) fd = atoi(argv[++i]);
		else if (i + 1 < argc && strcmp(argv[i], "--port") == 0) port = atoi(argv[++i]);
	}
	// As a sandbox's init (PID 1) only signals with a handler arrive.
	signal(SIGTERM, leave);
	signal(SIGINT, leave);
	signal(SIGPIPE, SIG_IGN);
	if (fd < 0) {
		struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((unsigned short)port)};
		int one = 1;
		fd = socket(AF_INET, SOCK_STREAM, 0);
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
		if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) < 0 || listen(fd, 128) < 0) {
			perror("stand-in: listen");
			return 1;
		}
	}
	for (;;) {
		int c = accept(fd, NULL, NULL);
		if (c < 0) continue;
		serve(c);
		close(c);
	}
}
