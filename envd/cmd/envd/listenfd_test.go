package main

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/skiff-dev/skiff/envd/proto/process/processconnect"
)

// TestListenFD: envd serves on an inherited, already listening socket. A
// request sent before envd even starts waits in the socket's backlog and is
// answered once envd runs (what lets sandboxd skip polling), and the
// processes envd starts do not inherit the socket.
func TestListenFD(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	sock, err := ln.(*net.TCPListener).File()
	if err != nil {
		t.Fatal(err)
	}
	_ = ln.Close() // sock still listens

	early, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer early.Close()
	if _, err := fmt.Fprint(early, "GET /health HTTP/1.1\r\nHost: envd\r\n\r\n"); err != nil {
		t.Fatal(err)
	}

	// --port 1 would fail to listen: envd must not use it.
	cmd := exec.Command(envdBin, "--listen-fd", "3", "--listen-address", "127.0.0.1", "--port", "1")
	cmd.ExtraFiles = []*os.File{sock}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	_ = sock.Close()
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })

	_ = early.SetReadDeadline(time.Now().Add(10 * time.Second))
	status, err := bufio.NewReader(early).ReadString('\n')
	if err != nil || !strings.HasPrefix(status, "HTTP/1.1 204") {
		t.Fatalf("the request sent before envd started: %q, %v", status, err)
	}

	in := &instance{client: processconnect.NewProcessClient(http.DefaultClient, "http://"+addr)}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r := in.run(ctx, bash("ls -l /proc/self/fd/ | grep -c socket: || true"), nil)
	if r.err != nil || strings.TrimSpace(r.stdout) != "0" {
		t.Fatalf("sockets a process of envd inherited: %q (stderr %q), %v", r.stdout, r.stderr, r.err)
	}
}

// --listen-fd takes a descriptor above stdin, stdout and stderr.
func TestListenFDRejectsStdio(t *testing.T) {
	for _, fd := range []string{"1", "2", "-1"} {
		out, err := exec.Command(envdBin, "--listen-fd", fd).CombinedOutput()
		if err == nil || !strings.Contains(string(out), "--listen-fd") {
			t.Errorf("--listen-fd %s: %v, %q", fd, err, out)
		}
	}
}
