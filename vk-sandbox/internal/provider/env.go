package provider

import (
	"context"
	"fmt"
	"regexp"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
)

// ConfigGetter reads the ConfigMaps and Secrets a pod's environment names:
// one GET each when its sandbox is created, never a list or a watch (a
// kubelet's view of its own pods' references, not of the cluster's).
type ConfigGetter interface {
	corev1client.ConfigMapsGetter
	corev1client.SecretsGetter
}

// envNameRE is what sandboxd accepts as a variable name.
var envNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// envResolver resolves one container's environment as the kubelet does:
// envFrom first, then env in order, each value expanding $(NAME) of the
// variables before it.
type envResolver struct {
	ctx    context.Context
	get    ConfigGetter
	pod    *corev1.Pod
	c      *corev1.Container
	hostIP string

	configMaps map[string]*corev1.ConfigMap
	secrets    map[string]*corev1.Secret
}

// resolveEnv is the environment of the pod's container.
func resolveEnv(ctx context.Context, get ConfigGetter, pod *corev1.Pod, c *corev1.Container, hostIP string) (map[string]string, error) {
	r := &envResolver{ctx: ctx, get: get, pod: pod, c: c, hostIP: hostIP,
		configMaps: map[string]*corev1.ConfigMap{}, secrets: map[string]*corev1.Secret{}}
	return r.resolve()
}

func (r *envResolver) resolve() (map[string]string, error) {
	env := map[string]string{}
	for _, from := range r.c.EnvFrom {
		if err := r.from(env, from); err != nil {
			return nil, err
		}
	}
	for _, v := range r.c.Env {
		if !envNameRE.MatchString(v.Name) {
			return nil, invalid("env %q: not a variable name a sandbox can take ([A-Za-z_][A-Za-z0-9_]*)", v.Name)
		}
		if v.ValueFrom == nil {
			env[v.Name] = expand(v.Value, env)
			continue
		}
		val, ok, err := r.valueFrom(v.Name, v.ValueFrom)
		if err != nil {
			return nil, err
		}
		if ok {
			env[v.Name] = val
		}
	}
	return env, nil
}

// from adds the variables of one envFrom source; keys that are not
// variable names are skipped, as the kubelet skips them.
func (r *envResolver) from(env map[string]string, from corev1.EnvFromSource) error {
	var data map[string]string
	switch {
	case from.ConfigMapRef != nil:
		cm, err := r.configMap(from.ConfigMapRef.Name, from.ConfigMapRef.Optional)
		if err != nil || cm == nil {
			return err
		}
		data = cm.Data
	case from.SecretRef != nil:
		s, err := r.secret(from.SecretRef.Name, from.SecretRef.Optional)
		if err != nil || s == nil {
			return err
		}
		data = map[string]string{}
		for k, v := range s.Data {
			data[k] = string(v)
		}
	default:
		return invalid("envFrom: neither a configMapRef nor a secretRef")
	}
	for k, v := range data {
		if name := from.Prefix + k; envNameRE.MatchString(name) {
			env[name] = v
		}
	}
	return nil
}

// valueFrom resolves one env's valueFrom; ok is false for an optional
// reference that is absent.
func (r *envResolver) valueFrom(name string, src *corev1.EnvVarSource) (val string, ok bool, err error) {
	switch {
	case src.FieldRef != nil:
		val, err := r.field(src.FieldRef.FieldPath)
		if err != nil {
			return "", false, fmt.Errorf("env %s: %w", name, err)
		}
		return val, true, nil
	case src.ResourceFieldRef != nil:
		val, err := r.resourceField(src.ResourceFieldRef)
		if err != nil {
			return "", false, fmt.Errorf("env %s: %w", name, err)
		}
		return val, true, nil
	case src.ConfigMapKeyRef != nil:
		ref := src.ConfigMapKeyRef
		cm, err := r.configMap(ref.Name, ref.Optional)
		if err != nil || cm == nil {
			return "", false, err
		}
		v, found := cm.Data[ref.Key]
		if !found && !isOptional(ref.Optional) {
			return "", false, fmt.Errorf("env %s: configmap %s/%s has no key %q", name, r.pod.Namespace, ref.Name, ref.Key)
		}
		return v, found, nil
	case src.SecretKeyRef != nil:
		ref := src.SecretKeyRef
		s, err := r.secret(ref.Name, ref.Optional)
		if err != nil || s == nil {
			return "", false, err
		}
		v, found := s.Data[ref.Key]
		if !found && !isOptional(ref.Optional) {
			return "", false, fmt.Errorf("env %s: secret %s/%s has no key %q", name, r.pod.Namespace, ref.Name, ref.Key)
		}
		return string(v), found, nil
	default:
		return "", false, invalid("env %s: this valueFrom is not supported by vk-sandbox", name)
	}
}

// field is a downward-API field of the pod, as the kubelet gives it
// before the pod has an IP.
func (r *envResolver) field(path string) (string, error) {
	pod := r.pod
	switch path {
	case "metadata.name":
		return pod.Name, nil
	case "metadata.namespace":
		return pod.Namespace, nil
	case "metadata.uid":
		return string(pod.UID), nil
	case "spec.nodeName":
		return pod.Spec.NodeName, nil
	case "spec.serviceAccountName":
		return pod.Spec.ServiceAccountName, nil
	case "status.hostIP", "status.hostIPs":
		return r.hostIP, nil
	case "status.podIP", "status.podIPs":
		return "", nil // assigned when the sandbox starts, after its environment
	}
	for prefix, m := range map[string]map[string]string{"metadata.labels": pod.Labels, "metadata.annotations": pod.Annotations} {
		if key, ok := strings.CutPrefix(path, prefix+"['"); ok {
			if key, ok = strings.CutSuffix(key, "']"); ok {
				return m[key], nil
			}
		}
	}
	return "", invalid("fieldRef %q is not supported by vk-sandbox", path)
}

// resourceField is a container resource, divided (rounding up) by the
// divisor. An absent limit is the request.
func (r *envResolver) resourceField(ref *corev1.ResourceFieldSelector) (string, error) {
	kind, res, ok := strings.Cut(ref.Resource, ".")
	if !ok || (kind != "limits" && kind != "requests") {
		return "", invalid("resourceFieldRef %q is not supported by vk-sandbox", ref.Resource)
	}
	q, found := r.c.Resources.Requests[corev1.ResourceName(res)]
	if kind == "limits" {
		if l, has := r.c.Resources.Limits[corev1.ResourceName(res)]; has {
			q, found = l, true
		}
	}
	if !found {
		return "0", nil
	}
	divisor := ref.Divisor
	if divisor.IsZero() {
		divisor = resource.MustParse("1")
	}
	if res == string(corev1.ResourceCPU) {
		return fmt.Sprint((q.MilliValue() + divisor.MilliValue() - 1) / divisor.MilliValue()), nil
	}
	return fmt.Sprint((q.Value() + divisor.Value() - 1) / divisor.Value()), nil
}

func (r *envResolver) configMap(name string, optional *bool) (*corev1.ConfigMap, error) {
	if cm, ok := r.configMaps[name]; ok {
		return cm, nil
	}
	cm, err := r.get.ConfigMaps(r.pod.Namespace).Get(r.ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) && isOptional(optional) {
		cm, err = nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("get configmap %s/%s: %w", r.pod.Namespace, name, err)
	}
	r.configMaps[name] = cm
	return cm, nil
}

func (r *envResolver) secret(name string, optional *bool) (*corev1.Secret, error) {
	if s, ok := r.secrets[name]; ok {
		return s, nil
	}
	s, err := r.get.Secrets(r.pod.Namespace).Get(r.ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) && isOptional(optional) {
		s, err = nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("get secret %s/%s: %w", r.pod.Namespace, name, err)
	}
	r.secrets[name] = s
	return s, nil
}

func isOptional(b *bool) bool { return b != nil && *b }

// expand replaces $(NAME) in s by the value of a variable defined before
// it, as the kubelet does: $$ is a literal $, and a reference to an
// undefined variable is left as it is.
func expand(s string, env map[string]string) string {
	if !strings.Contains(s, "$") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 >= len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch s[i+1] {
		case '$':
			b.WriteByte('$')
			i++
		case '(':
			end := strings.IndexByte(s[i+2:], ')')
			if end < 0 {
				b.WriteString(s[i:])
				return b.String()
			}
			name := s[i+2 : i+2+end]
			if v, ok := env[name]; ok {
				b.WriteString(v)
			} else {
				b.WriteString(s[i : i+3+end])
			}
			i += 2 + end
		default:
			b.WriteByte('$')
		}
	}
	return b.String()
}
