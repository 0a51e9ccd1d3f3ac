package provider

import (
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/skiff-dev/skiff/api/v1beta1"
)

func testPod(mod func(*corev1.Pod)) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "team-a", UID: "3f1c9a52-6f0e-4b8e-9d36-2b3e8f7a1c44"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "sandbox", Image: "ghcr.io/acme/python:3.12"}}},
	}
	if mod != nil {
		mod(p)
	}
	return p
}

func TestTemplateOf(t *testing.T) {
	tests := []struct {
		image, annotation string
		hasAnnotation     bool
		want              string
		wantErr           bool
	}{
		{image: "ghcr.io/acme/python:3.12", want: "python"},
		{image: "base", want: "base"},
		{image: "registry:5000/team/code-interpreter@sha256:abc", want: "code-interpreter"},
		{image: "localhost:5000/base:v1", want: "base"},
		{image: "ghcr.io/acme/python:3.12", annotation: "base", hasAnnotation: true, want: "base"},
		{image: "ghcr.io/acme/python", annotation: "", hasAnnotation: true, wantErr: true},
		{image: "", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.image+"/"+tt.annotation, func(t *testing.T) {
			p := testPod(func(p *corev1.Pod) {
				p.Spec.Containers[0].Image = tt.image
				if tt.hasAnnotation {
					p.Annotations = map[string]string{AnnotationTemplate: tt.annotation}
				}
			})
			got, err := templateOf(p, &p.Spec.Containers[0])
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Errorf("templateOf = %q, %v; want %q (error %v)", got, err, tt.want, tt.wantErr)
			}
			if err != nil && !errors.Is(err, errInvalidPod) {
				t.Errorf("error %v is not errInvalidPod", err)
			}
		})
	}
}

func TestTimeoutOf(t *testing.T) {
	deadline := int64(90)
	tests := []struct {
		name    string
		mod     func(*corev1.Pod)
		want    time.Duration
		wantErr bool
	}{
		{"default", nil, time.Hour, false},
		{"activeDeadlineSeconds", func(p *corev1.Pod) { p.Spec.ActiveDeadlineSeconds = &deadline }, 90 * time.Second, false},
		{"activeDeadlineSeconds wins", func(p *corev1.Pod) {
			p.Spec.ActiveDeadlineSeconds = &deadline
			p.Annotations = map[string]string{AnnotationTimeout: "5m"}
		}, 90 * time.Second, false},
		{"duration annotation", func(p *corev1.Pod) { p.Annotations = map[string]string{AnnotationTimeout: "90m"} }, 90 * time.Minute, false},
		{"seconds annotation", func(p *corev1.Pod) { p.Annotations = map[string]string{AnnotationTimeout: "600"} }, 10 * time.Minute, false},
		{"bad annotation", func(p *corev1.Pod) { p.Annotations = map[string]string{AnnotationTimeout: "soon"} }, 0, true},
		{"negative annotation", func(p *corev1.Pod) { p.Annotations = map[string]string{AnnotationTimeout: "-5m"} }, 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := timeoutOf(testPod(tt.mod), time.Hour)
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Errorf("timeoutOf = %s, %v; want %s (error %v)", got, err, tt.want, tt.wantErr)
			}
		})
	}
}

func TestCreateRequest(t *testing.T) {
	p := testPod(func(p *corev1.Pod) {
		p.Spec.Containers[0].Resources.Requests = corev1.ResourceList{
			corev1.ResourceCPU: resource.MustParse("1500m"), corev1.ResourceMemory: resource.MustParse("300M"),
			corev1.ResourceEphemeralStorage: resource.MustParse("2Gi"),
		}
	})
	req, err := createRequest(p, map[string]string{"A": "b"}, 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	// 300 MB is 286.1 MiB: rounded up.
	if req.GetTemplate() != "python" || req.GetTeam() != "team-a" || req.GetTimeout().AsDuration() != 10*time.Minute ||
		req.GetResources().GetCpuMilli() != 1500 || req.GetResources().GetMemoryMib() != 287 || req.GetResources().GetDiskMib() != 2048 ||
		req.GetEnvVars()["A"] != "b" || req.GetMetadata()[MetaPodUID] != string(p.UID) || req.GetMetadata()[MetaPodName] != "p" {
		t.Errorf("request: %v", req)
	}
	// No requests: the template's resources.
	req, err = createRequest(testPod(nil), nil, time.Minute)
	if err != nil || req.GetResources().GetCpuMilli() != 0 || req.GetResources().GetMemoryMib() != 0 {
		t.Errorf("request without requests: %v, %v", req, err)
	}
	for name, mod := range map[string]func(*corev1.Pod){
		"two containers": func(p *corev1.Pod) {
			p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "b", Image: "x"})
		},
		"init containers":   func(p *corev1.Pod) { p.Spec.InitContainers = []corev1.Container{{Name: "i", Image: "x"}} },
		"a bad timeout":     func(p *corev1.Pod) { p.Annotations = map[string]string{AnnotationTimeout: "x"} },
		"an empty template": func(p *corev1.Pod) { p.Annotations = map[string]string{AnnotationTemplate: ""} },
	} {
		if _, err := createRequest(testPod(mod), nil, time.Minute); !errors.Is(err, errInvalidPod) {
			t.Errorf("%s: %v, want errInvalidPod", name, err)
		}
	}
}

func TestPodLinkStaysInTheInventorysBound(t *testing.T) {
	for _, name := range []string{"p", strings.Repeat("n", 126), strings.Repeat("n", 127), strings.Repeat("n", 253)} {
		link := podLink(testPod(func(p *corev1.Pod) { p.Name = name }))
		total := 0
		for k, v := range link {
			total += len(k) + len(v)
		}
		if total > v1beta1.MaxSandboxMetadataBytes || link[MetaPodUID] == "" {
			t.Errorf("name of %d bytes: link %v is %d bytes", len(name), link, total)
		}
		if _, has := link[MetaPodName]; has != (len(name) <= 126) {
			t.Errorf("name of %d bytes: has the name %v", len(name), has)
		}
	}
}
