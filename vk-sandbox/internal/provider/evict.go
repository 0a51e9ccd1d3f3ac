package provider

import (
	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
)

// reasonDeletionByTaintManager is the reason of the DisruptionTarget
// condition the taint-eviction controller sets on a pod before it deletes
// it for a NoExecute taint the pod does not tolerate.
const reasonDeletionByTaintManager = "DeletionByTaintManager"

// healthTaints are the NoExecute taints the node lifecycle controller puts
// on a node it cannot hear from (lease expired) or that reports NotReady.
var healthTaints = map[string]bool{
	corev1.TaintNodeUnreachable: true,
	corev1.TaintNodeNotReady:    true,
}

// evictedForNodeHealth reports whether pod is being deleted because its
// node looked dead to the control plane — an eviction that must not kill
// a sandbox still running on a live sandboxd, since a control-plane
// hiccup (or a vk-sandbox restart, or sandboxd's own) is not a host death.
// node is this node as the informer last saw it (nil if unknown).
//
//   - A DisruptionTarget condition with reason DeletionByTaintManager: the
//     taint-eviction controller deleted it. That is the node's health,
//     unless the node also carries a NoExecute taint of an operator's
//     that the pod does not tolerate (a drain by taint: kill).
//   - Any other DisruptionTarget (preemption, the eviction API, pod GC):
//     a decision about the pod, not a guess about the node: kill.
//   - No DisruptionTarget (a user or a controller, or a cluster that does
//     not set the condition): released only while the node carries a
//     health taint; otherwise the pod was deleted while the node was
//     Ready, and its sandbox is killed.
func evictedForNodeHealth(pod *corev1.Pod, node *corev1.Node) bool {
	var disruption *corev1.PodCondition
	for i := range pod.Status.Conditions {
		if c := &pod.Status.Conditions[i]; c.Type == corev1.DisruptionTarget && c.Status == corev1.ConditionTrue {
			disruption = c
		}
	}
	if disruption != nil && disruption.Reason != reasonDeletionByTaintManager {
		return false
	}
	var healthTainted, foreign bool
	if node != nil {
		for i := range node.Spec.Taints {
			taint := &node.Spec.Taints[i]
			if taint.Effect != corev1.TaintEffectNoExecute {
				continue
			}
			if healthTaints[taint.Key] {
				healthTainted = true
			} else if !tolerates(pod, taint) {
				foreign = true
			}
		}
	}
	if disruption != nil {
		return !foreign
	}
	return healthTainted
}

func tolerates(pod *corev1.Pod, taint *corev1.Taint) bool {
	for i := range pod.Spec.Tolerations {
		if pod.Spec.Tolerations[i].ToleratesTaint(logr.Discard(), taint, true) {
			return true
		}
	}
	return false
}
