package server_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/skiff-dev/skiff/envd/internal/server"
	pb "github.com/skiff-dev/skiff/envd/proto/process"
	"github.com/skiff-dev/skiff/envd/proto/process/processconnect"
)

// benchEnvd starts an in-process envd behind httptest on loopback and
// returns its URL and an HTTP client for it; everything is torn down when the
// benchmark ends.
func benchEnvd(tb testing.TB) (baseURL string, client *http.Client) {
	tb.Helper()
	srv := server.New(server.NewOptions())
	ts := httptest.NewServer(srv.Handler())
	tb.Cleanup(func() {
		ts.CloseClientConnections()
		ts.Close()
		srv.Close()
	})
	return ts.URL, ts.Client()
}

// reportPercentiles sorts the per-iteration latencies and reports the
// nearest-rank p50 and p99 in milliseconds.
func reportPercentiles(b *testing.B, samples []time.Duration, percentiles ...int) {
	b.Helper()
	if len(samples) == 0 {
		return
	}
	slices.Sort(samples)
	for _, p := range percentiles {
		rank := max(int(math.Ceil(float64(p)/100*float64(len(samples)))), 1)
		ms := float64(samples[rank-1]) / float64(time.Millisecond)
		b.ReportMetric(ms, fmt.Sprintf("p%d-ms", p))
	}
}

// BenchmarkCommandRoundTrip is the SDK's commands.run('true'): a Start stream
// over Connect JSON, read to its end event. "bash" runs `/bin/bash -c true`
// (no login shell: that would read the host's profile), "direct" runs
// /bin/true, separating envd's own overhead from bash's start.
func BenchmarkCommandRoundTrip(b *testing.B) {
	baseURL, httpClient := benchEnvd(b)
	client := processconnect.NewProcessClient(httpClient, baseURL, connect.WithProtoJSON())
	no := false
	for _, bc := range []struct {
		name string
		req  *pb.StartRequest
	}{
		{"bash", bash("true")},
		{"direct", &pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/bin/true"}, Stdin: &no}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			ctx := b.Context()
			var samples []time.Duration
			for b.Loop() {
				start := time.Now()
				stream, err := client.Start(ctx, connect.NewRequest(bc.req))
				if err != nil {
					b.Fatalf("Start: %v", err)
				}
				r := collect(stream, func() *pb.ProcessEvent { return stream.Msg().GetEvent() })
				_ = stream.Close()
				samples = append(samples, time.Since(start))
				if r.err != nil || r.end == nil || r.end.GetExitCode() != 0 {
					b.Fatalf("end %v err %v, want a clean exit", r.end, r.err)
				}
			}
			reportPercentiles(b, samples, 50, 99)
		})
	}
}

const benchFileSize = 100 << 20

// BenchmarkFiles100MB uploads (POST /files, application/octet-stream) and
// downloads (GET /files, identity encoding) a 100 MB file over loopback.
func BenchmarkFiles100MB(b *testing.B) {
	baseURL, client := benchEnvd(b)
	// One copy of the data, random so that nothing on the way can shortcut
	// it; uploads stream it from a bytes.Reader.
	data := make([]byte, benchFileSize)
	_, _ = rand.NewChaCha8([32]byte{'s', 'k', 'i', 'f', 'f'}).Read(data) // never fails
	fileURL := func(path string) string {
		return baseURL + "/files?" + url.Values{"path": {path}}.Encode()
	}
	upload := func(b *testing.B, path string) {
		b.Helper()
		req, err := http.NewRequestWithContext(b.Context(), http.MethodPost, fileURL(path), bytes.NewReader(data))
		if err != nil {
			b.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/octet-stream")
		resp, err := client.Do(req)
		if err != nil {
			b.Fatalf("upload: %v", err)
		}
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b.Fatalf("upload: %s: %s", resp.Status, body)
		}
	}
	// download reads the body into w and returns how many bytes it read.
	download := func(b *testing.B, path string, w io.Writer) int64 {
		b.Helper()
		req, err := http.NewRequestWithContext(b.Context(), http.MethodGet, fileURL(path), http.NoBody)
		if err != nil {
			b.Fatal(err)
		}
		// Raw throughput: without this the transport asks for gzip.
		req.Header.Set("Accept-Encoding", "identity")
		resp, err := client.Do(req)
		if err != nil {
			b.Fatalf("download: %v", err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			b.Fatalf("download: %s: %s", resp.Status, body)
		}
		n, err := io.Copy(w, resp.Body)
		if err != nil {
			b.Fatalf("download body: %v", err)
		}
		return n
	}

	b.Run("upload", func(b *testing.B) {
		path := filepath.Join(b.TempDir(), "upload.bin")
		b.SetBytes(benchFileSize)
		b.ReportAllocs()
		for b.Loop() {
			upload(b, path)
		}
		b.StopTimer()
		if fi, err := os.Stat(path); err != nil || fi.Size() != benchFileSize {
			b.Fatalf("uploaded file: %v, %v; want %d bytes", fi, err, benchFileSize)
		}
	})
	b.Run("download", func(b *testing.B) {
		path := filepath.Join(b.TempDir(), "download.bin")
		upload(b, path)
		// Check the content once, untimed, without another copy of it.
		cmp := &compareWriter{want: data}
		if n := download(b, path, cmp); n != benchFileSize || cmp.mismatch {
			b.Fatalf("downloaded %d bytes (mismatch %v), want the %d uploaded", n, cmp.mismatch, benchFileSize)
		}
		b.SetBytes(benchFileSize)
		b.ReportAllocs()
		for b.Loop() {
			if n := download(b, path, io.Discard); n != benchFileSize {
				b.Fatalf("downloaded %d bytes, want %d", n, benchFileSize)
			}
		}
	})
}

// compareWriter checks what is written to it against want.
type compareWriter struct {
	want     []byte
	mismatch bool
}

func (c *compareWriter) Write(p []byte) (int, error) {
	if len(p) > len(c.want) || !bytes.Equal(p, c.want[:len(p)]) {
		c.mismatch = true
		return 0, errors.New("downloaded content differs from the upload")
	}
	c.want = c.want[len(p):]
	return len(p), nil
}

// BenchmarkStartup times starting the real envd binary until GET /health
// answers 204.
func BenchmarkStartup(b *testing.B) {
	bin := buildEnvd(b)
	// A fresh connection per poll: the processes come and go.
	client := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	b.Cleanup(client.CloseIdleConnections)

	var samples []time.Duration
	for b.Loop() {
		b.StopTimer()
		port := freePort(b)
		b.StartTimer()
		samples = append(samples, startOnce(b, client, bin, port))
	}
	reportPercentiles(b, samples, 50, 99)
}

// buildEnvd returns the envd binary the benchmarks start: $ENVD_BENCH_BIN
// (to compare two builds, or profile one with symbols; TestMain sets it to
// a build of its own when it runs as root), else one built here.
func buildEnvd(b *testing.B) string {
	b.Helper()
	if bin := os.Getenv(benchBinEnv); bin != "" {
		return bin
	}
	bin := filepath.Join(b.TempDir(), "envd")
	if err := goBuildEnvd(b.Context(), bin); err != nil {
		b.Fatal(err)
	}
	return bin
}

// goBuildEnvd builds envd as make build does (static, stripped) into bin.
func goBuildEnvd(ctx context.Context, bin string) error {
	build := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags", "-s -w", "-o", bin, "./cmd/envd")
	build.Dir = filepath.Join("..", "..") // the module root, from internal/server
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("go build: %w\n%s", err, out)
	}
	return nil
}

// freePort returns a loopback port that was free a moment ago.
func freePort(tb testing.TB) int {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	if err := ln.Close(); err != nil {
		tb.Fatal(err)
	}
	return port
}

// startOnce starts bin on port, waits for /health to answer 204 and returns
// how long that took. The process is ended and waited for before it returns,
// also when the benchmark fails; stopping it is not timed.
func startOnce(b *testing.B, client *http.Client, bin string, port int) time.Duration {
	b.Helper()
	var stderr bytes.Buffer
	cmd := exec.Command(bin, "--listen-address", "127.0.0.1", "--port", strconv.Itoa(port))
	cmd.Stderr = &stderr
	start := time.Now()
	if err := cmd.Start(); err != nil {
		b.Fatalf("start envd: %v", err)
	}
	exited := make(chan struct{})
	var waitErr error
	go func() {
		waitErr = cmd.Wait()
		close(exited)
	}()
	defer func() {
		b.StopTimer()
		stopProcess(cmd, exited)
		b.StartTimer()
	}()

	health := "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) + "/health"
	deadline := start.Add(10 * time.Second)
	for {
		if healthy(b.Context(), client, health) {
			return time.Since(start)
		}
		select {
		case <-exited:
			b.Fatalf("envd exited before answering /health: %v\n%s", waitErr, stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			b.Fatalf("envd did not answer 204 on /health within 10s")
		}
		time.Sleep(time.Millisecond)
	}
}

// healthy reports whether GET url answers 204.
func healthy(ctx context.Context, client *http.Client, url string) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, http.NoBody)
	if err != nil {
		return false
	}
	resp, err := client.Do(req)
	if err != nil {
		return false
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return resp.StatusCode == http.StatusNoContent
}

// stopProcess sends SIGTERM, then SIGKILL if the process lingers, and waits
// until the goroutine waiting for it closed exited.
func stopProcess(cmd *exec.Cmd, exited <-chan struct{}) {
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
		return
	case <-time.After(10 * time.Second):
	}
	_ = cmd.Process.Kill()
	<-exited
}

// BenchmarkLifeCPU is envd's part of a sandbox's lifecycle as sandboxd's
// native runtime gives it: started on a socket that already listens
// (--listen-fd, so the first request waits for envd instead of polling it)
// as the init of a pid namespace of its own (as root; otherwise a
// subreaper, --init), one Start stream of /bin/true read to its end, then
// SIGTERM and exit. It reports the CPU envd spent, user and system, its
// command's included (wait4's resource usage), as cpu-µs/op: what a change
// to envd's start or exit saves every sandbox.
func BenchmarkLifeCPU(b *testing.B) {
	bin := buildEnvd(b)
	no := false
	req := &pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/bin/true"}, Stdin: &no}
	var cpu time.Duration
	for b.Loop() {
		cpu += lifeOnce(b, bin, req)
	}
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/op")
}

// lifeOnce runs envd once as BenchmarkLifeCPU describes and returns its CPU.
func lifeOnce(b *testing.B, bin string, req *pb.StartRequest) time.Duration {
	b.Helper()
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		b.Fatal(err)
	}
	lf, err := ln.File()
	_ = ln.Close()
	if err != nil {
		b.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd := exec.Command(bin, "--init", "--listen-fd", "3")
	if os.Geteuid() == 0 {
		cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID}
	}
	cmd.ExtraFiles = []*os.File{lf}
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		b.Fatalf("start envd: %v", err)
	}
	_ = lf.Close()
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	url := "http://" + ln.Addr().String()
	httpClient := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	client := processconnect.NewProcessClient(httpClient, url, connect.WithProtoJSON())
	ctx, cancel := context.WithTimeout(b.Context(), 10*time.Second)
	stream, err := client.Start(ctx, connect.NewRequest(req))
	if err == nil {
		for stream.Receive() {
		}
		err = stream.Err()
		_ = stream.Close()
	}
	cancel()
	stopProcess(cmd, exited)
	if err != nil {
		b.Fatalf("start /bin/true: %v\n%s", err, stderr.String())
	}
	u := cmd.ProcessState.SysUsage().(*syscall.Rusage)
	return time.Duration(syscall.TimevalToNsec(u.Utime) + syscall.TimevalToNsec(u.Stime))
}
