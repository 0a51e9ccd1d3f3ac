package provider

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"time"

	"connectrpc.com/connect"
	"github.com/virtual-kubelet/virtual-kubelet/errdefs"
	"github.com/virtual-kubelet/virtual-kubelet/node/api"
	"google.golang.org/protobuf/types/known/timestamppb"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/skiff-dev/skiff/shared/sandboxdapi"
	pb "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
)

// maxLogLines is the most lines one read of sandboxd's log returns.
const maxLogLines = 10000

// followInterval is how often a followed log asks sandboxd for new lines
// (its Logs call is not a stream).
const followInterval = time.Second

// GetContainerLogs returns the output of the pod's sandbox: its
// processes' stdout and stderr and envd's own lines, oldest first, as
// `kubectl logs` shows them (--tail, --since, --since-time, --timestamps,
// --limit-bytes and --follow). The log goes with its sandbox.
func (p *Provider) GetContainerLogs(ctx context.Context, namespace, podName, containerName string, opts api.ContainerLogOpts) (io.ReadCloser, error) {
	pod, err := p.cfg.Pods.Pods(namespace).Get(podName)
	if apierrors.IsNotFound(err) {
		return nil, errdefs.NotFoundf("pod %s/%s not found on this node", namespace, podName)
	}
	if err != nil {
		return nil, fmt.Errorf("get pod %s/%s from the cache: %w", namespace, podName, err)
	}
	if len(pod.Spec.Containers) == 0 || pod.Spec.Containers[0].Name != containerName {
		return nil, errdefs.NotFoundf("pod %s/%s has no sandbox container %q", namespace, podName, containerName)
	}
	if opts.Previous {
		return nil, errdefs.InvalidInput("a sandbox is never restarted: there is no previous log")
	}
	p.mu.Lock()
	var id string
	if st := p.pods[pod.UID]; st != nil && st.sandbox != nil {
		id = st.sandbox.GetId()
	}
	p.mu.Unlock()
	if id == "" {
		return nil, errdefs.NotFoundf("pod %s/%s has no sandbox", namespace, podName)
	}
	req := &pb.LogsRequest{SandboxId: id, Limit: maxLogLines}
	if opts.Tail > 0 {
		req.Limit = int32(min(opts.Tail, maxLogLines))
	}
	switch {
	case !opts.SinceTime.IsZero():
		req.Start = timestamppb.New(opts.SinceTime)
	case opts.SinceSeconds > 0:
		req.Start = timestamppb.New(p.now().Add(-time.Duration(opts.SinceSeconds) * time.Second))
	}
	resp, err := p.readLog(ctx, req)
	if err != nil {
		return nil, err
	}
	entries := resp.GetLogs()
	if !opts.Follow {
		var b bytes.Buffer
		w := &logWriter{w: &b, timestamps: opts.Timestamps, limit: opts.LimitBytes}
		w.writeAll(entries)
		return io.NopCloser(&b), nil
	}
	r, w := io.Pipe()
	go p.follow(ctx, req, entries, &logWriter{w: w, timestamps: opts.Timestamps, limit: opts.LimitBytes}, w)
	return r, nil
}

func (p *Provider) readLog(ctx context.Context, req *pb.LogsRequest) (*pb.LogsResponse, error) {
	resp, err := p.cfg.Sandboxd.Logs(ctx, connect.NewRequest(req))
	if connect.CodeOf(err) == connect.CodeNotFound {
		return nil, errdefs.NotFoundf("sandbox %s is gone, and its log with it", req.GetSandboxId())
	}
	if err != nil {
		return nil, fmt.Errorf("read the log of sandbox %s: %w", req.GetSandboxId(), err)
	}
	return resp.Msg, nil
}

// follow writes entries, then every new line, until the reader goes, ctx
// ends or the sandbox does. It owns pw and closes it.
//
// It reads forward from a cursor: the time of the last line shown and how
// many lines of that time it has shown, which sandboxd skips (a sandboxd
// before skip says it did not, and they are left out here). After the
// first read (the newest lines): its lines of its last line's time, when
// the read holds every one of them (it begins earlier, or was not cut);
// else everything up to that time is taken as had (envd stamps each
// write's lines after the last write's, so only a write read half way
// under a --tail loses its rest).
func (p *Provider) follow(ctx context.Context, req *pb.LogsRequest, entries []*pb.LogEntry, w *logWriter, pw *io.PipeWriter) {
	var at time.Time
	seen := 0
	if req.GetStart() != nil {
		at = req.GetStart().AsTime()
	}
	if n := len(entries); n > 0 {
		at, seen = entries[n-1].GetTimestamp().AsTime(), sameTime(entries)
		if seen == n && cut(entries, req.GetLimit()) {
			at, seen = at.Add(time.Nanosecond), 0
		}
	}
	if !w.writeAll(entries) {
		_ = pw.Close()
		return
	}
	t := time.NewTicker(followInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			_ = pw.CloseWithError(ctx.Err())
			return
		case <-t.C:
		}
		// The oldest lines from the cursor on: a burst of more than a
		// page between two reads is read in pages, none skipped.
		next := &pb.LogsRequest{SandboxId: req.GetSandboxId(), Limit: maxLogLines, Forward: true, Skip: int32(seen)} //nolint:gosec // lines of one time
		if !at.IsZero() {
			next.Start = timestamppb.New(at)
		}
		resp, err := p.readLog(ctx, next)
		if err != nil {
			_ = pw.Close() // the sandbox ended: so does its log
			return
		}
		es := resp.GetLogs()
		for drop := seen - int(resp.GetSkipped()); drop > 0 && len(es) > 0 && es[0].GetTimestamp().AsTime().Equal(at); drop-- {
			es = es[1:]
		}
		if !w.writeAll(es) {
			_ = pw.Close()
			return
		}
		if n := len(es); n > 0 {
			if last := es[n-1].GetTimestamp().AsTime(); last.Equal(at) {
				seen += n
			} else {
				at, seen = last, sameTime(es)
			}
		}
	}
}

// cut says whether a newest-first read of limit lines may have left out
// older lines: it is full, or within a line of sandboxd's bound on an
// answer's text.
func cut(es []*pb.LogEntry, limit int32) bool {
	text := 0
	for _, e := range es {
		text += len(e.GetLine())
	}
	return len(es) >= int(limit) || text > sandboxdapi.MaxLogsAnswerBytes-sandboxdapi.MaxLogLineBytes
}

// sameTime is how many of es, from the last back, have the last one's
// time.
func sameTime(es []*pb.LogEntry) int {
	last, n := es[len(es)-1].GetTimestamp().AsTime(), 0
	for i := len(es) - 1; i >= 0 && es[i].GetTimestamp().AsTime().Equal(last); i-- {
		n++
	}
	return n
}

// logWriter writes log lines as kubectl logs shows them, up to limit
// bytes (0: no limit).
type logWriter struct {
	w          io.Writer
	timestamps bool
	limit      int
	written    int
}

// writeAll writes entries until one does not go; false then.
func (l *logWriter) writeAll(es []*pb.LogEntry) bool {
	for _, e := range es {
		if !l.write(e) {
			return false
		}
	}
	return true
}

// write writes one entry; false when the limit is reached or the reader
// went.
func (l *logWriter) write(e *pb.LogEntry) bool {
	line := e.GetLine() + "\n"
	if l.timestamps {
		line = e.GetTimestamp().AsTime().UTC().Format(time.RFC3339Nano) + " " + line
	}
	if l.limit > 0 && l.written+len(line) > l.limit {
		line = line[:l.limit-l.written]
	}
	n, err := io.WriteString(l.w, line)
	l.written += n
	return err == nil && (l.limit == 0 || l.written < l.limit)
}
