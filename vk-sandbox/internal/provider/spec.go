package provider

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/skiff-dev/skiff/api/v1beta1"
	pb "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
)

// Annotations a pod may carry.
const (
	// AnnotationTemplate names the sandbox template; without it the
	// template is the last path element of the container's image, without
	// tag or digest (ghcr.io/acme/python:3.12 starts template python).
	AnnotationTemplate = "skiff.dev/template"
	// AnnotationTimeout is the sandbox's lifetime, a Go duration ("90m")
	// or seconds ("5400"), when the pod has no activeDeadlineSeconds.
	AnnotationTimeout = "skiff.dev/timeout"
)

// Metadata that links a sandbox to its pod. A sandbox without
// MetaPodUID (one made through the e2b API) is never touched.
const (
	// MetaPodUID is the pod's UID: the link itself.
	MetaPodUID = "skiff.dev/pod-uid"
	// MetaPodName is the pod's name (its namespace is the sandbox's team),
	// left out when it would take the metadata past its bound.
	MetaPodName = "skiff.dev/pod"
)

// errInvalidPod marks a pod that can never become a sandbox: it fails
// instead of being retried.
var errInvalidPod = errors.New("invalid pod")

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errInvalidPod, fmt.Sprintf(format, args...))
}

// sandboxContainer is the pod's one container, which the sandbox is.
func sandboxContainer(pod *corev1.Pod) (*corev1.Container, error) {
	if len(pod.Spec.Containers) != 1 || len(pod.Spec.InitContainers) != 0 {
		return nil, invalid("a sandbox pod has exactly one container and no init containers, this one has %d and %d",
			len(pod.Spec.Containers), len(pod.Spec.InitContainers))
	}
	return &pod.Spec.Containers[0], nil
}

// templateOf is the template a pod asks for.
func templateOf(pod *corev1.Pod, c *corev1.Container) (string, error) {
	if t, ok := pod.Annotations[AnnotationTemplate]; ok {
		if t == "" {
			return "", invalid("annotation %s is empty", AnnotationTemplate)
		}
		return t, nil
	}
	name := c.Image
	if i := strings.Index(name, "@"); i >= 0 {
		name = name[:i]
	}
	if i := strings.LastIndex(name, "/"); i >= 0 {
		name = name[i+1:]
	}
	if i := strings.Index(name, ":"); i >= 0 {
		name = name[:i]
	}
	if name == "" {
		return "", invalid("no template: set annotation %s or an image named after the template", AnnotationTemplate)
	}
	return name, nil
}

// timeoutOf is the sandbox's lifetime: activeDeadlineSeconds, else the
// timeout annotation, else def.
func timeoutOf(pod *corev1.Pod, def time.Duration) (time.Duration, error) {
	if s := pod.Spec.ActiveDeadlineSeconds; s != nil {
		return time.Duration(*s) * time.Second, nil
	}
	v, ok := pod.Annotations[AnnotationTimeout]
	if !ok {
		return def, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		secs, serr := strconv.ParseInt(v, 10, 64)
		if serr != nil {
			return 0, invalid("annotation %s=%q is neither a duration (90m) nor seconds", AnnotationTimeout, v)
		}
		d = time.Duration(secs) * time.Second
	}
	if d <= 0 {
		return 0, invalid("annotation %s=%q must be positive", AnnotationTimeout, v)
	}
	return d, nil
}

// resourcesOf sums what the container requests; 0 leaves it to the
// template.
func resourcesOf(c *corev1.Container) *pb.Resources {
	r := &pb.Resources{}
	if q, ok := c.Resources.Requests[corev1.ResourceCPU]; ok {
		r.CpuMilli = q.MilliValue()
	}
	if q, ok := c.Resources.Requests[corev1.ResourceMemory]; ok {
		r.MemoryMib = ceilMiB(q)
	}
	if q, ok := c.Resources.Requests[corev1.ResourceEphemeralStorage]; ok {
		r.DiskMib = ceilMiB(q)
	}
	return r
}

func ceilMiB(q resource.Quantity) int64 {
	const mib = 1 << 20
	return (q.Value() + mib - 1) / mib
}

// podLink is the metadata linking a sandbox to pod, within the
// inventory's bound.
func podLink(pod *corev1.Pod) map[string]string {
	m := map[string]string{MetaPodUID: string(pod.UID)}
	if len(MetaPodUID)+len(pod.UID)+len(MetaPodName)+len(pod.Name) <= v1beta1.MaxSandboxMetadataBytes {
		m[MetaPodName] = pod.Name
	}
	return m
}

// createRequest is the sandbox a pod asks for, with env its resolved
// environment.
func createRequest(pod *corev1.Pod, env map[string]string, defaultTimeout time.Duration) (*pb.CreateRequest, error) {
	c, err := sandboxContainer(pod)
	if err != nil {
		return nil, err
	}
	tmpl, err := templateOf(pod, c)
	if err != nil {
		return nil, err
	}
	timeout, err := timeoutOf(pod, defaultTimeout)
	if err != nil {
		return nil, err
	}
	return &pb.CreateRequest{
		Template:  tmpl,
		Resources: resourcesOf(c),
		EnvVars:   env,
		Metadata:  podLink(pod),
		Timeout:   durationpb.New(timeout),
		Team:      pod.Namespace,
	}, nil
}
