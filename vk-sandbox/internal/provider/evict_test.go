package provider

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
)

func TestEvictedForNodeHealth(t *testing.T) {
	unreachable := corev1.Taint{Key: corev1.TaintNodeUnreachable, Effect: corev1.TaintEffectNoExecute}
	notReady := corev1.Taint{Key: corev1.TaintNodeNotReady, Effect: corev1.TaintEffectNoExecute}
	drain := corev1.Taint{Key: "example.com/drain", Effect: corev1.TaintEffectNoExecute}
	ours := corev1.Taint{Key: "virtual-kubelet.io/provider", Value: "skiff", Effect: corev1.TaintEffectNoSchedule}
	node := func(taints ...corev1.Taint) *corev1.Node { return &corev1.Node{Spec: corev1.NodeSpec{Taints: taints}} }
	disrupted := func(reason string) func(*corev1.Pod) {
		return func(p *corev1.Pod) {
			p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue, Reason: reason})
		}
	}
	tolerateDrain := func(p *corev1.Pod) {
		p.Spec.Tolerations = append(p.Spec.Tolerations, corev1.Toleration{Key: "example.com/drain", Operator: corev1.TolerationOpExists})
	}
	tests := []struct {
		name string
		pod  func(*corev1.Pod)
		node *corev1.Node
		want bool
	}{
		{"a user deletes it on a Ready node", nil, node(ours), false},
		{"a user deletes it on an unknown node", nil, nil, false},
		{"deleted while the node is unreachable", nil, node(ours, unreachable), true},
		{"deleted while the node is NotReady", nil, node(notReady), true},
		{"taint eviction for unreachable", disrupted("DeletionByTaintManager"), node(ours, unreachable), true},
		{"taint eviction after the node came back (taint gone)", disrupted("DeletionByTaintManager"), node(ours), true},
		{"taint eviction for an operator's taint", disrupted("DeletionByTaintManager"), node(drain), false},
		{"taint eviction for an operator's taint beside unreachable", disrupted("DeletionByTaintManager"), node(drain, unreachable), false},
		{"an operator's taint the pod tolerates", func(p *corev1.Pod) {
			disrupted("DeletionByTaintManager")(p)
			tolerateDrain(p)
		}, node(drain, unreachable), true},
		{"preempted", disrupted("PreemptionByScheduler"), node(unreachable), false},
		{"the eviction API (kubectl drain)", disrupted("EvictionByEvictionAPI"), node(), false},
		{"pod garbage collection", disrupted("DeletionByPodGC"), node(unreachable), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := evictedForNodeHealth(testPod(tt.pod), tt.node); got != tt.want {
				t.Errorf("evictedForNodeHealth = %v, want %v", got, tt.want)
			}
		})
	}
}
