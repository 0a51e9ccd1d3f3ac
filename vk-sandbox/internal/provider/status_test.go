package provider

import (
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	pb "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
)

var t0 = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

func runningSandbox(state pb.SandboxState) *pb.Sandbox {
	return &pb.Sandbox{Id: "abcdefghijklmnopqrst", Template: "base", TemplateVersion: "v1", State: state, Team: "team-a",
		StartedAt: timestamppb.New(t0), EndAt: timestamppb.New(t0.Add(time.Hour)), Address: "10.1.2.2"}
}

func condition(st corev1.PodStatus, typ corev1.PodConditionType) *corev1.PodCondition {
	for i := range st.Conditions {
		if st.Conditions[i].Type == typ {
			return &st.Conditions[i]
		}
	}
	return nil
}

func TestPodStatusRunning(t *testing.T) {
	scheduled := corev1.PodCondition{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: metav1.NewTime(t0.Add(-time.Minute))}
	pod := testPod(func(p *corev1.Pod) {
		p.Status.Conditions = []corev1.PodCondition{scheduled}
		p.Status.QOSClass = corev1.PodQOSBestEffort
	})
	st := podStatus(pod, runningSandbox(pb.SandboxState_SANDBOX_STATE_RUNNING), nil, "192.0.2.1")
	if st.Phase != corev1.PodRunning || st.PodIP != "10.1.2.2" || st.HostIP != "192.0.2.1" || st.StartTime == nil || !st.StartTime.Time.Equal(t0) {
		t.Errorf("status: %+v", st)
	}
	if st.QOSClass != corev1.PodQOSBestEffort {
		t.Error("the QOS class the API set was dropped")
	}
	if c := condition(st, corev1.PodScheduled); c == nil || !equality.Semantic.DeepEqual(*c, scheduled) {
		t.Errorf("PodScheduled (the scheduler's) changed: %+v", c)
	}
	if c := condition(st, corev1.PodReady); c == nil || c.Status != corev1.ConditionTrue || !c.LastTransitionTime.Time.Equal(t0) {
		t.Errorf("Ready: %+v", c)
	}
	cs := st.ContainerStatuses
	if len(cs) != 1 || cs[0].ContainerID != "skiff://abcdefghijklmnopqrst" || !cs[0].Ready || cs[0].State.Running == nil ||
		cs[0].Started == nil || !*cs[0].Started || cs[0].ImageID != "skiff-template://base@v1" || cs[0].Image != pod.Spec.Containers[0].Image {
		t.Errorf("container statuses: %+v", cs)
	}
	// Computed again from a pod that carries it, it is the same status:
	// a restart of vk-sandbox writes nothing new.
	pod.Status = st
	if again := podStatus(pod, runningSandbox(pb.SandboxState_SANDBOX_STATE_RUNNING), nil, "192.0.2.1"); !equality.Semantic.DeepEqual(again, st) {
		t.Errorf("not stable:\n%+v\n%+v", again, st)
	}
	// Paused: running, not ready, and Ready's transition is new.
	paused := podStatus(pod, runningSandbox(pb.SandboxState_SANDBOX_STATE_PAUSED), nil, "192.0.2.1")
	if c := condition(paused, corev1.PodReady); paused.Phase != corev1.PodRunning || c.Status != corev1.ConditionFalse || c.Reason != "SandboxPaused" || paused.ContainerStatuses[0].Ready {
		t.Errorf("paused: %+v", paused)
	}
}

func TestPodStatusEnded(t *testing.T) {
	pod := testPod(nil)
	pod.Status = podStatus(pod, runningSandbox(pb.SandboxState_SANDBOX_STATE_RUNNING), nil, "192.0.2.1")
	end := &ending{phase: corev1.PodFailed, reason: ReasonSandboxKilled, message: "m", exitCode: 137, at: t0.Add(time.Minute)}
	st := podStatus(pod, runningSandbox(pb.SandboxState_SANDBOX_STATE_RUNNING), end, "192.0.2.1")
	if st.Phase != corev1.PodFailed || st.Reason != ReasonSandboxKilled || st.Message != "m" {
		t.Errorf("status: %+v", st)
	}
	term := st.ContainerStatuses[0].State.Terminated
	if term == nil || term.ExitCode != 137 || term.Reason != ReasonSandboxKilled || !term.StartedAt.Time.Equal(t0) ||
		!term.FinishedAt.Time.Equal(t0.Add(time.Minute)) || term.ContainerID != "skiff://abcdefghijklmnopqrst" || st.ContainerStatuses[0].Ready {
		t.Errorf("terminated: %+v", st.ContainerStatuses[0])
	}
	if c := condition(st, corev1.PodReady); c.Status != corev1.ConditionFalse || c.Reason != "PodFailed" || !c.LastTransitionTime.Time.Equal(t0.Add(time.Minute)) {
		t.Errorf("Ready: %+v", c)
	}
	// A pod rejected before it had a sandbox: no container ID.
	st = podStatus(testPod(nil), nil, &ending{phase: corev1.PodFailed, reason: ReasonRejected, at: t0}, "")
	if st.Phase != corev1.PodFailed || st.ContainerStatuses[0].ContainerID != "" || st.ContainerStatuses[0].State.Terminated == nil {
		t.Errorf("rejected: %+v", st)
	}
}

func TestEndings(t *testing.T) {
	deadline := int64(60)
	withDeadline := testPod(func(p *corev1.Pod) { p.Spec.ActiveDeadlineSeconds = &deadline })
	sb := runningSandbox(pb.SandboxState_SANDBOX_STATE_RUNNING) // ends at t0+1h
	tests := []struct {
		name   string
		st     *podState
		now    time.Time
		reason string
		phase  corev1.PodPhase
	}{
		{"killed for the pod's deletion", &podState{pod: testPod(nil), sandbox: sb, killed: true}, t0.Add(time.Minute), ReasonKilled, corev1.PodFailed},
		{"killed outside Kubernetes", &podState{pod: testPod(nil), sandbox: sb}, t0.Add(time.Minute), ReasonSandboxKilled, corev1.PodFailed},
		{"lived out its timeout", &podState{pod: testPod(nil), sandbox: sb}, t0.Add(time.Hour), ReasonCompleted, corev1.PodSucceeded},
		{"past activeDeadlineSeconds", &podState{pod: withDeadline, sandbox: sb}, t0.Add(time.Hour + time.Second), ReasonDeadlineExceeded, corev1.PodFailed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := endingOf(tt.st, tt.now)
			if e.reason != tt.reason || e.phase != tt.phase {
				t.Errorf("ending %+v, want %s %s", e, tt.phase, tt.reason)
			}
		})
	}
	// Ended while vk-sandbox was away: by the deadline if it has passed.
	started := testPod(func(p *corev1.Pod) { p.Status.StartTime = &metav1.Time{Time: t0} })
	if e := endedUnseen(started, t0.Add(30*time.Minute), time.Hour); e.reason != ReasonSandboxLost {
		t.Errorf("before the deadline: %+v", e)
	}
	if e := endedUnseen(started, t0.Add(2*time.Hour), time.Hour); e.reason != ReasonCompleted || !e.at.Equal(t0.Add(time.Hour)) {
		t.Errorf("after the deadline: %+v", e)
	}
}
