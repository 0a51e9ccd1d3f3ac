package provider

import (
	"context"
	"errors"
	"fmt"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"
	corev1 "k8s.io/api/core/v1"

	pb "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
)

// CreatePod makes the pod's sandbox. A pod that already has one (found
// by its link after a restart, or by a retried call) is adopted; a pod
// that had one which is gone is ended, never given a second. A pod that
// cannot be a sandbox, or that sandboxd refuses, fails at once; an error
// that may pass (sandboxd unreachable) is returned, and virtual-kubelet
// retries.
func (p *Provider) CreatePod(ctx context.Context, pod *corev1.Pod) error {
	st := p.state(pod)
	st.op.Lock()
	defer st.op.Unlock()
	p.mu.Lock()
	st.pod = pod.DeepCopy()
	st.retry = false
	done := st.sandbox != nil || st.end != nil || st.released
	p.mu.Unlock()
	if done {
		p.kick()
		return nil
	}
	sbs, err := p.cfg.Mirror.Sandboxes()
	if err != nil {
		// sandboxd cannot be heard: decide nothing about this pod now (it
		// may have a sandbox); sync tries again once it is heard.
		p.log.Info("sandboxd is not in sync: a pod's sandbox waits", "pod", pod.Namespace+"/"+pod.Name, "error", err)
		p.retryLater(st)
		return nil
	}
	for _, sb := range sbs {
		if linkOf(sb) == pod.UID {
			p.mu.Lock()
			st.sandbox, st.seen = sb, true
			p.mu.Unlock()
			p.kick()
			return nil
		}
	}
	now := p.now()
	if id := sandboxID(pod); id != "" {
		p.end(st, endedUnseen(pod, now, p.cfg.DefaultTimeout))
		return nil
	}
	req, err := p.request(ctx, pod)
	if errors.Is(err, errInvalidPod) {
		p.log.Warn("a pod cannot be a sandbox", "pod", pod.Namespace+"/"+pod.Name, "error", err)
		p.end(st, &ending{phase: corev1.PodFailed, reason: ReasonRejected, message: err.Error(), exitCode: 1, at: now})
		return nil
	}
	if err != nil {
		p.log.Warn("resolve a pod's environment; trying again", "pod", pod.Namespace+"/"+pod.Name, "error", err)
		p.retryLater(st)
		return nil
	}
	start := time.Now()
	resp, err := p.cfg.Sandboxd.Create(ctx, connect.NewRequest(req))
	if err != nil {
		code := connect.CodeOf(err)
		p.cfg.Metrics.created(code.String(), time.Since(start))
		switch code {
		case connect.CodeInvalidArgument, connect.CodeFailedPrecondition, connect.CodeAlreadyExists, connect.CodeOutOfRange:
			p.log.Warn("sandboxd refused a pod's sandbox", "pod", pod.Namespace+"/"+pod.Name, "error", err)
			p.end(st, &ending{phase: corev1.PodFailed, reason: ReasonRejected, message: connectMessage(err), exitCode: 1, at: p.now()})
			return nil
		case connect.CodeResourceExhausted:
			p.log.Warn("sandboxd has no room for a pod's sandbox", "pod", pod.Namespace+"/"+pod.Name, "error", err)
			p.end(st, &ending{phase: corev1.PodFailed, reason: ReasonOutOfCapacity, message: connectMessage(err), exitCode: 1, at: p.now()})
			return nil
		}
		// Maybe made, maybe not: the next try looks in the mirror first.
		p.log.Warn("create a pod's sandbox; trying again", "pod", pod.Namespace+"/"+pod.Name, "error", err)
		p.retryLater(st)
		return nil
	}
	p.cfg.Metrics.created("ok", time.Since(start))
	sb := resp.Msg.GetSandbox()
	p.log.Info("created the sandbox of a pod", "pod", pod.Namespace+"/"+pod.Name, "sandbox", sb.GetId(), "template", sb.GetTemplate())
	p.mu.Lock()
	if st.sandbox == nil { // the mirror may have been first
		st.sandbox = sb
	}
	st.createdAt, st.attempts = now, 0
	p.mu.Unlock()
	p.kick()
	return nil
}

// retryLater has sync create st's sandbox again after a backoff (1 s
// doubling to 30 s). Transient failures are retried here rather than
// returned: virtual-kubelet answers a failed create by writing the pod's
// status (Failed, for restartPolicy Never), which a pod that ran must not
// get because sandboxd was briefly unreachable.
func (p *Provider) retryLater(st *podState) {
	p.mu.Lock()
	defer p.mu.Unlock()
	st.retry = true
	st.retryAt = p.now().Add(min(time.Second<<min(st.attempts, 5), 30*time.Second))
	st.attempts++
}

// request is the CreateRequest of pod, environment resolved.
func (p *Provider) request(ctx context.Context, pod *corev1.Pod) (*pb.CreateRequest, error) {
	c, err := sandboxContainer(pod)
	if err != nil {
		return nil, err
	}
	env, err := resolveEnv(ctx, p.cfg.Config, pod, c, p.cfg.HostIP)
	if err != nil {
		return nil, err
	}
	return createRequest(pod, env, p.cfg.DefaultTimeout)
}

// end records how st's pod ended and pushes its status.
func (p *Provider) end(st *podState, e *ending) {
	p.mu.Lock()
	if st.end == nil {
		st.end = e
		p.cfg.Metrics.ended(e.reason)
	}
	p.mu.Unlock()
	p.kick()
}

// UpdatePod takes a pod whose spec changed. A new activeDeadlineSeconds or
// timeout annotation moves the sandbox's deadline (from its start, as
// activeDeadlineSeconds counts); one already past kills it. A pod without
// a sandbox yet is created.
func (p *Provider) UpdatePod(ctx context.Context, pod *corev1.Pod) error {
	st := p.state(pod)
	p.mu.Lock()
	sb, done := st.sandbox, st.end != nil || st.released
	p.mu.Unlock()
	if done {
		return nil
	}
	if sb == nil {
		return p.CreatePod(ctx, pod)
	}
	st.op.Lock()
	defer st.op.Unlock()
	p.mu.Lock()
	st.pod = pod.DeepCopy()
	p.mu.Unlock()
	timeout, err := timeoutOf(pod, p.cfg.DefaultTimeout)
	if err != nil || sb.GetStartedAt() == nil || sb.GetEndAt() == nil {
		return nil //nolint:nilerr // a bad new annotation keeps the deadline the sandbox has
	}
	want := sb.GetStartedAt().AsTime().Add(timeout)
	if d := want.Sub(sb.GetEndAt().AsTime()); d > -time.Second && d < time.Second {
		return nil
	}
	// Errors are logged, not returned: virtual-kubelet answers a failed
	// update by writing the pod's status, and the sandbox still runs.
	left := want.Sub(p.now())
	if left <= 0 {
		_ = p.kill(ctx, sb.GetId(), "its pod's new deadline has passed")
		return nil
	}
	if _, err := p.cfg.Sandboxd.SetTimeout(ctx, connect.NewRequest(&pb.SetTimeoutRequest{
		SandboxId: sb.GetId(), Timeout: durationpb.New(left.Round(time.Second)),
	})); err != nil && connect.CodeOf(err) != connect.CodeNotFound {
		p.log.Error("move the deadline of a pod's sandbox", "pod", pod.Namespace+"/"+pod.Name, "sandbox", sb.GetId(), "error", err)
		return nil
	}
	p.log.Info("moved the deadline of a pod's sandbox", "pod", pod.Namespace+"/"+pod.Name, "sandbox", sb.GetId(), "end_at", want)
	return nil
}

// DeletePod ends the pod's sandbox, unless the pod is being evicted
// because its node looked dead (evictedForNodeHealth): then the sandbox is
// released — left running, detached from the pod, until its own deadline —
// because a node that the control plane cannot hear may well be running
// its sandboxes. Either way the pod is reported terminated, so that
// virtual-kubelet removes it.
func (p *Provider) DeletePod(ctx context.Context, pod *corev1.Pod) error {
	st := p.state(pod)
	st.op.Lock()
	defer st.op.Unlock()
	p.mu.Lock()
	sb, released, ended := st.sandbox, st.released, st.end != nil
	p.mu.Unlock()
	if released {
		return nil
	}
	if sb == nil {
		sbs, err := p.cfg.Mirror.Sandboxes()
		if err != nil {
			// It may have a sandbox that cannot be seen now: virtual-kubelet
			// tries the deletion again.
			return fmt.Errorf("delete the sandbox of pod %s/%s: %w", pod.Namespace, pod.Name, err)
		}
		for _, s := range sbs {
			if linkOf(s) == pod.UID {
				sb = s
			}
		}
	}
	if sb == nil || ended {
		if !ended {
			p.end(st, &ending{phase: corev1.PodFailed, reason: ReasonKilled, message: "the pod was deleted before its sandbox started", exitCode: 137, at: p.now()})
		}
		return nil
	}
	var node *corev1.Node
	if p.cfg.Node != nil {
		node, _ = p.cfg.Node()
	}
	if evictedForNodeHealth(pod, node) {
		p.log.Warn("a pod was evicted because its node looked dead: its sandbox is released and keeps running until its deadline",
			"pod", pod.Namespace+"/"+pod.Name, "sandbox", sb.GetId())
		p.cfg.Metrics.releasedOne()
		p.mu.Lock()
		st.released = true
		p.mu.Unlock()
		if notify := p.notifier(); notify != nil {
			out := pod.DeepCopy()
			out.Status = podStatus(pod, sb, &ending{phase: corev1.PodFailed, reason: ReasonReleased, exitCode: 0, at: p.now(),
				message: "evicted while the node looked dead; the sandbox keeps running on its host, detached from this pod, until its deadline"}, p.cfg.HostIP)
			notify(out)
		}
		return nil
	}
	p.mu.Lock()
	st.killed = true
	p.mu.Unlock()
	if err := p.kill(ctx, sb.GetId(), "its pod was deleted"); err != nil {
		p.mu.Lock()
		st.killed = false
		p.mu.Unlock()
		return err
	}
	p.kick()
	return nil
}

func (p *Provider) notifier() func(*corev1.Pod) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.notifyFn
}

// kill kills a sandbox; one already gone is no error.
func (p *Provider) kill(ctx context.Context, id, why string) error {
	_, err := p.cfg.Sandboxd.Kill(ctx, connect.NewRequest(&pb.KillRequest{SandboxId: id}))
	if err != nil && connect.CodeOf(err) != connect.CodeNotFound {
		p.cfg.Metrics.killed(connect.CodeOf(err).String())
		p.log.Error("kill a pod's sandbox", "sandbox", id, "why", why, "error", err)
		return fmt.Errorf("kill sandbox %s: %w", id, err)
	}
	p.cfg.Metrics.killed("ok")
	p.log.Info("killed a pod's sandbox", "sandbox", id, "why", why)
	return nil
}

// connectMessage is a Connect error's message, for a pod's status.
func connectMessage(err error) string {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce.Message()
	}
	return err.Error()
}
