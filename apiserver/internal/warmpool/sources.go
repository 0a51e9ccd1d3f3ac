package warmpool

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/skiff-dev/skiff/api/v1beta1"
	"github.com/skiff-dev/skiff/apiserver/internal/fleet"
)

// StaticNamespace is the namespace of the pools --warm-pool declares.
const StaticNamespace = "default"

// StaticPools are pools from flags: template=replicas each.
type StaticPools []Pool

// ParseStatic parses --warm-pool values ("base=4"), one pool per template,
// named after it in StaticNamespace.
func ParseStatic(specs []string) (StaticPools, error) {
	var out StaticPools
	for _, s := range specs {
		template, n, ok := strings.Cut(s, "=")
		replicas, err := strconv.ParseInt(n, 10, 32)
		switch {
		case !ok || template == "":
			return nil, fmt.Errorf("--warm-pool %q: want template=replicas, such as base=4", s)
		case err != nil || replicas < 0:
			return nil, fmt.Errorf("--warm-pool %q: replicas must be a whole number, 0 or more", s)
		case len(validation.IsDNS1123Subdomain(template)) > 0:
			return nil, fmt.Errorf("--warm-pool %q: %q is not a template name: %s", s, template, strings.Join(validation.IsDNS1123Subdomain(template), "; "))
		}
		key := StaticNamespace + "/" + template
		if slices.ContainsFunc(out, func(p Pool) bool { return p.Key == key }) {
			return nil, fmt.Errorf("--warm-pool %q: template %s has a pool already", s, template)
		}
		out = append(out, Pool{Key: key, Template: template, Replicas: int32(replicas)})
	}
	return out, nil
}

// List returns the pools.
func (s StaticPools) List(context.Context) ([]Pool, error) { return s, nil }

// KubePools are the SandboxWarmPool objects of a cache.
type KubePools struct{ Reader client.Reader }

// List returns every SandboxWarmPool.
func (k KubePools) List(ctx context.Context) ([]Pool, error) {
	var l v1beta1.SandboxWarmPoolList
	if err := k.Reader.List(ctx, &l); err != nil {
		return nil, err
	}
	out := make([]Pool, 0, len(l.Items))
	for i := range l.Items {
		obj := &l.Items[i]
		p := Pool{Key: obj.Namespace + "/" + obj.Name, Template: obj.Spec.Template, Replicas: 1, Object: obj}
		if obj.Spec.Replicas != nil {
			p.Replicas = *obj.Spec.Replicas
		}
		if r := obj.Spec.Resources; r != nil {
			p.Resources = fleet.Defaults{CPUMilli: r.CPUMilli, MemoryMiB: r.MemoryMiB}
		}
		out = append(out, p)
	}
	return out, nil
}

// KubeStatus writes pools' status through the status subresource, when it
// changed.
type KubeStatus struct{ Client client.Client }

// WriteStatus patches p's status to st unless it is st already.
func (k KubeStatus) WriteStatus(ctx context.Context, p Pool, st v1beta1.SandboxWarmPoolStatus) error {
	if equality.Semantic.DeepEqual(p.Object.Status, st) {
		return nil
	}
	obj := p.Object.DeepCopy()
	orig := obj.DeepCopy()
	obj.Status = st
	return k.Client.Status().Patch(ctx, obj, client.MergeFrom(orig))
}

// setCondition returns conds with the condition of typ set, its transition
// time moved only when its status changes.
func setCondition(conds []metav1.Condition, typ, status, reason, msg string, generation int64, now time.Time) []metav1.Condition {
	out := slices.Clone(conds)
	meta.SetStatusCondition(&out, metav1.Condition{
		Type: typ, Status: metav1.ConditionStatus(status), Reason: reason, Message: msg,
		ObservedGeneration: generation, LastTransitionTime: metav1.NewTime(now.Truncate(time.Second)),
	})
	return out
}
