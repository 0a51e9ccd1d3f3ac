package provider

import (
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	pb "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
)

// containerIDPrefix starts the container ID of a pod's sandbox:
// skiff://<sandbox ID>. A pod whose status carries one has had a sandbox.
const containerIDPrefix = "skiff://"

// Why a pod's sandbox ended: pod and container reasons.
const (
	// ReasonKilled: the pod was deleted and its sandbox killed.
	ReasonKilled = "Killed"
	// ReasonDeadlineExceeded: the sandbox reached the pod's
	// activeDeadlineSeconds (the kubelet's reason for the same).
	ReasonDeadlineExceeded = "DeadlineExceeded"
	// ReasonCompleted: the sandbox lived out its timeout.
	ReasonCompleted = "Completed"
	// ReasonSandboxKilled: the sandbox was killed outside Kubernetes (the
	// e2b API, or sandboxd) before its deadline.
	ReasonSandboxKilled = "SandboxKilled"
	// ReasonSandboxDied: the sandbox ended by itself: its envd died
	// (killed by the memory limit, crashed); the message says how.
	ReasonSandboxDied = "SandboxDied"
	// ReasonSandboxLost: the sandbox ended while vk-sandbox was not
	// watching, before its deadline (killed, or the host restarted).
	ReasonSandboxLost = "SandboxLost"
	// ReasonRejected: the pod cannot be a sandbox (see the message).
	ReasonRejected = "SandboxRejected"
	// ReasonOutOfCapacity: sandboxd had no room for the sandbox.
	ReasonOutOfCapacity = "OutOfCapacity"
	// ReasonReleased: the pod was evicted because its node looked dead
	// while its sandbox still ran; the sandbox keeps running, detached.
	ReasonReleased = "Released"
)

// ending is how a pod's sandbox ended (or why it never started).
type ending struct {
	phase    corev1.PodPhase
	reason   string
	message  string
	exitCode int32
	at       time.Time
}

// sandboxID is the ID in a pod's container status, or "".
func sandboxID(pod *corev1.Pod) string {
	for _, cs := range pod.Status.ContainerStatuses {
		if id, ok := strings.CutPrefix(cs.ContainerID, containerIDPrefix); ok {
			return id
		}
	}
	return ""
}

// podStatus is pod's status given its sandbox (nil if none) and how it
// ended (nil while it runs). Conditions of others (PodScheduled,
// DisruptionTarget) are kept, and a condition that keeps its status keeps
// its transition time, so the same sandbox gives the same status across
// restarts of vk-sandbox.
func podStatus(pod *corev1.Pod, sb *pb.Sandbox, end *ending, hostIP string) corev1.PodStatus {
	st := *pod.Status.DeepCopy()
	if hostIP != "" {
		st.HostIP, st.HostIPs = hostIP, []corev1.HostIP{{IP: hostIP}}
	}
	var started time.Time
	switch {
	case sb != nil && sb.GetStartedAt() != nil:
		started = sb.GetStartedAt().AsTime()
	case pod.Status.StartTime != nil:
		started = pod.Status.StartTime.Time
	}
	if !started.IsZero() && st.StartTime == nil {
		st.StartTime = &metav1.Time{Time: started}
	}
	if sb.GetAddress() != "" {
		st.PodIP, st.PodIPs = sb.GetAddress(), []corev1.PodIP{{IP: sb.GetAddress()}}
	}
	id := sandboxID(pod)
	if sb != nil {
		id = sb.GetId()
	}

	if end != nil {
		st.Phase, st.Reason, st.Message = end.phase, end.reason, end.message
		at := end.at
		readyReason := "PodFailed"
		if end.phase == corev1.PodSucceeded {
			readyReason = "PodCompleted"
		}
		setCondition(&st, corev1.PodReadyToStartContainers, corev1.ConditionFalse, "", at)
		setCondition(&st, corev1.PodInitialized, corev1.ConditionTrue, "", at)
		setCondition(&st, corev1.ContainersReady, corev1.ConditionFalse, readyReason, at)
		setCondition(&st, corev1.PodReady, corev1.ConditionFalse, readyReason, at)
		st.ContainerStatuses = containerStatuses(pod, id, func(c *corev1.Container) corev1.ContainerState {
			term := &corev1.ContainerStateTerminated{ExitCode: end.exitCode, Reason: end.reason, Message: end.message,
				FinishedAt: metav1.Time{Time: at}}
			if !started.IsZero() && id != "" {
				term.StartedAt = metav1.Time{Time: started}
				term.ContainerID = containerIDPrefix + id
			}
			return corev1.ContainerState{Terminated: term}
		}, false)
		return st
	}
	if sb == nil {
		return st
	}
	ready, readyReason := corev1.ConditionTrue, ""
	if sb.GetState() == pb.SandboxState_SANDBOX_STATE_PAUSED {
		ready, readyReason = corev1.ConditionFalse, "SandboxPaused"
	}
	st.Phase, st.Reason, st.Message = corev1.PodRunning, "", ""
	setCondition(&st, corev1.PodReadyToStartContainers, corev1.ConditionTrue, "", started)
	setCondition(&st, corev1.PodInitialized, corev1.ConditionTrue, "", started)
	setCondition(&st, corev1.ContainersReady, ready, readyReason, started)
	setCondition(&st, corev1.PodReady, ready, readyReason, started)
	st.ContainerStatuses = containerStatuses(pod, id, func(*corev1.Container) corev1.ContainerState {
		return corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Time{Time: started}}}
	}, ready == corev1.ConditionTrue)
	if sb.GetTemplateVersion() != "" {
		for i := range st.ContainerStatuses {
			st.ContainerStatuses[i].ImageID = "skiff-template://" + sb.GetTemplate() + "@" + sb.GetTemplateVersion()
		}
	}
	return st
}

// containerStatuses gives every container of pod the state state gives
// it; the sandbox is the first.
func containerStatuses(pod *corev1.Pod, id string, state func(*corev1.Container) corev1.ContainerState, ready bool) []corev1.ContainerStatus {
	out := make([]corev1.ContainerStatus, 0, len(pod.Spec.Containers))
	for i := range pod.Spec.Containers {
		c := &pod.Spec.Containers[i]
		cs := corev1.ContainerStatus{Name: c.Name, Image: c.Image, State: state(c), Ready: ready && i == 0}
		if i == 0 && id != "" {
			cs.ContainerID = containerIDPrefix + id
			started := cs.State.Running != nil
			cs.Started = &started
		}
		out = append(out, cs)
	}
	return out
}

// setCondition sets one condition of vk-sandbox's, keeping its transition
// time when its status does not change.
func setCondition(st *corev1.PodStatus, typ corev1.PodConditionType, status corev1.ConditionStatus, reason string, at time.Time) {
	c := corev1.PodCondition{Type: typ, Status: status, Reason: reason, LastTransitionTime: metav1.Time{Time: at}}
	for i := range st.Conditions {
		if st.Conditions[i].Type != typ {
			continue
		}
		if st.Conditions[i].Status == status {
			c.LastTransitionTime = st.Conditions[i].LastTransitionTime
		}
		st.Conditions[i] = c
		return
	}
	st.Conditions = append(st.Conditions, c)
}

// terminal reports whether a phase is final.
func terminal(p corev1.PodPhase) bool {
	return p == corev1.PodSucceeded || p == corev1.PodFailed
}
