package vknode

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"log/slog"
	"math/big"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/skiff-dev/skiff/api/v1beta1"
)

// health stands in for sandboxd's mirror.
type health struct {
	mu  sync.Mutex
	ok  bool
	err error
	inv *v1beta1.NodeInventory
}

func (h *health) Synced() (bool, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.ok, h.err
}

func (h *health) Inventory() (*v1beta1.NodeInventory, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.ok {
		return nil, h.err
	}
	return h.inv, nil
}

func (h *health) set(ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ok = ok
	h.err = nil
	if !ok {
		h.err = errors.New("connection refused")
	}
}

func TestNodeStatusFollowsSandboxd(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	n := newNode(Spec{Name: "host-a", HostIP: "192.0.2.1", KubeletPort: 10250})
	if st, reason := nodeReady(n); st != corev1.ConditionFalse || reason != reasonUnreachable {
		t.Errorf("a new node is %s/%s, want NotReady until sandboxd is heard", st, reason)
	}
	if n.Labels[LabelHost] != "host-a" || n.Labels["type"] != "virtual-kubelet" || len(n.Spec.Taints) != 1 ||
		n.Spec.Taints[0] != (corev1.Taint{Key: TaintKey, Value: TaintValue, Effect: corev1.TaintEffectNoSchedule}) {
		t.Errorf("node: %+v", n.ObjectMeta)
	}
	inv := &v1beta1.NodeInventory{Spec: v1beta1.NodeInventorySpec{Capacity: v1beta1.NodeCapacity{CPUMilli: 8000, MemoryMiB: 16384, Sandboxes: 64}}}
	setNodeStatus(n, true, nil, inv, now)
	cpu, mem, pods := n.Status.Allocatable[corev1.ResourceCPU], n.Status.Allocatable[corev1.ResourceMemory], n.Status.Allocatable[corev1.ResourcePods]
	if cpu.MilliValue() != 8000 || mem.Value() != 16384<<20 || pods.Value() != 64 {
		t.Errorf("allocatable %v", n.Status.Allocatable)
	}
	if st, _ := nodeReady(n); st != corev1.ConditionTrue {
		t.Errorf("Ready = %s", st)
	}
	// A later status that keeps Ready keeps its transition time.
	setNodeStatus(n, true, nil, inv, now.Add(time.Hour))
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady && !c.LastTransitionTime.Time.Equal(now) {
			t.Errorf("Ready moved its transition time to %s", c.LastTransitionTime)
		}
	}
	// A host that does not admit CPU advertises as much as its slots could
	// ask: kube-scheduler refuses no pod for CPU that sandboxd would take.
	shared := inv.DeepCopy()
	shared.Spec.CPUAdmission = v1beta1.CPUShared
	setNodeStatus(n, true, nil, shared, now.Add(time.Hour))
	if cpu := n.Status.Allocatable[corev1.ResourceCPU]; cpu.MilliValue() != 64*SharedCPUPerSlot {
		t.Errorf("shared CPU: allocatable cpu %v, want 64 slots × 8", cpu.String())
	}
	setNodeStatus(n, true, nil, inv, now.Add(time.Hour))
	setNodeStatus(n, false, errors.New("refused"), nil, now.Add(2*time.Hour))
	if st, reason := nodeReady(n); st != corev1.ConditionFalse || reason != reasonUnreachable {
		t.Errorf("after sandboxd went: %s %s", st, reason)
	}
	if cpu := n.Status.Allocatable[corev1.ResourceCPU]; cpu.MilliValue() != 8000 {
		t.Error("an unreachable sandboxd dropped the capacity")
	}
}

// The node's DiskPressure follows the host's inventory, and holds while
// sandboxd is not heard.
func TestNodeDiskPressure(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	n := newNode(Spec{Name: "host-a", HostIP: "192.0.2.1", KubeletPort: 10250})
	disk := func() corev1.NodeCondition {
		t.Helper()
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeDiskPressure {
				return c
			}
		}
		t.Fatal("no DiskPressure condition")
		return corev1.NodeCondition{}
	}
	if c := disk(); c.Status != corev1.ConditionFalse {
		t.Errorf("a new node's DiskPressure = %s", c.Status)
	}
	inv := &v1beta1.NodeInventory{Spec: v1beta1.NodeInventorySpec{Capacity: v1beta1.NodeCapacity{CPUMilli: 8000, MemoryMiB: 16384, Sandboxes: 64}}}
	setNodeStatus(n, true, nil, inv, now)
	if c := disk(); c.Status != corev1.ConditionFalse {
		t.Errorf("DiskPressure = %s without pressure", c.Status)
	}
	for _, tc := range []struct {
		state, volumes bool
		status         corev1.ConditionStatus
		words          string
	}{
		{true, false, corev1.ConditionTrue, "sandboxes' and snapshots' filesystem is below sandboxd's --disk-reserve"},
		// A full volume store alone: sandboxes still start, and the
		// condition's taint would stop every pod.
		{false, true, corev1.ConditionFalse, "its volume store is below the reserve too"},
		{true, true, corev1.ConditionTrue, "its volume store is below the reserve too"},
	} {
		pressed := inv.DeepCopy()
		pressed.Spec.DiskPressure, pressed.Spec.VolumeDiskPressure = tc.state, tc.volumes
		setNodeStatus(n, true, nil, pressed, now.Add(time.Hour))
		if c := disk(); c.Status != tc.status || !strings.Contains(c.Message, tc.words) {
			t.Errorf("state %v, volumes %v: DiskPressure %+v", tc.state, tc.volumes, c)
		}
	}
	if c := disk(); c.Reason != "BelowDiskReserve" || !c.LastTransitionTime.Time.Equal(now.Add(time.Hour)) {
		t.Errorf("DiskPressure %+v, want it True since the first pressure", c)
	}
	// Not heard: what was last known holds, with its transition time.
	setNodeStatus(n, false, errors.New("refused"), nil, now.Add(2*time.Hour))
	if c := disk(); c.Status != corev1.ConditionTrue || !c.LastTransitionTime.Time.Equal(now.Add(time.Hour)) {
		t.Errorf("DiskPressure while sandboxd is not heard: %+v", c)
	}
	setNodeStatus(n, true, nil, inv, now.Add(3*time.Hour))
	if c := disk(); c.Status != corev1.ConditionFalse || !c.LastTransitionTime.Time.Equal(now.Add(3*time.Hour)) {
		t.Errorf("DiskPressure after space came back: %+v", c)
	}
}

func TestPingFailsOnceTheNodeShowsNotReady(t *testing.T) {
	h := &health{}
	h.set(true)
	observed := newNode(Spec{Name: "host-a"})
	setNodeStatus(observed, true, nil, nil, time.Now())
	var mu sync.Mutex
	p := newNodeProvider(h, func() (*corev1.Node, error) {
		mu.Lock()
		defer mu.Unlock()
		return observed.DeepCopy(), nil
	}, newNode(Spec{Name: "host-a"}), time.Hour, slog.New(slog.DiscardHandler))
	now := time.Now()
	p.now = func() time.Time { return now }
	var notified []*corev1.Node
	p.NotifyNodeStatus(t.Context(), func(n *corev1.Node) { notified = append(notified, n) })
	p.update(t.Context())
	if err := p.Ping(t.Context()); err != nil {
		t.Fatalf("Ping with sandboxd heard: %v", err)
	}
	// sandboxd goes: the NotReady status is notified, and Ping holds until
	// the API shows it (virtual-kubelet writes no status while Ping fails).
	h.set(false)
	p.update(t.Context())
	if len(notified) == 0 {
		t.Fatal("nothing notified")
	}
	if st, _ := nodeReady(notified[len(notified)-1]); st != corev1.ConditionFalse {
		t.Fatalf("notified Ready=%s", st)
	}
	if err := p.Ping(t.Context()); err != nil {
		t.Fatalf("Ping failed before the NotReady status reached the API: %v", err)
	}
	mu.Lock()
	observed = notified[len(notified)-1]
	mu.Unlock()
	if err := p.Ping(t.Context()); err == nil {
		t.Fatal("Ping succeeds with sandboxd unheard and the node NotReady: the lease would be renewed")
	}
	// Or after the grace, whatever the API shows.
	mu.Lock()
	setNodeStatus(observed, true, nil, nil, now)
	mu.Unlock()
	now = now.Add(2 * time.Hour)
	if err := p.Ping(t.Context()); err == nil {
		t.Fatal("Ping succeeds past the grace")
	}
	// Back: Ping succeeds and Ready is notified.
	h.set(true)
	if err := p.Ping(t.Context()); err != nil {
		t.Fatal(err)
	}
	p.update(t.Context())
	if st, _ := nodeReady(notified[len(notified)-1]); st != corev1.ConditionTrue {
		t.Errorf("notified Ready=%s after sandboxd came back", st)
	}
}

func TestKubeletTLSRequiresAClientCertificateFromTheCA(t *testing.T) {
	dir := t.TempDir()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kube-ca"}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	caFile := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	client := func(signer *x509.Certificate, key *ecdsa.PrivateKey) tls.Certificate {
		k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "kube-apiserver-kubelet-client"},
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, KeyUsage: x509.KeyUsageDigitalSignature,
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
		if signer == nil {
			signer, key = tmpl, k
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, signer, &k.PublicKey, key)
		if err != nil {
			t.Fatal(err)
		}
		return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: k}
	}

	if _, err := (KubeletTLS{}).Config("host-a", "127.0.0.1"); err == nil {
		t.Error("a kubelet API with neither a client CA nor --kubelet-insecure-no-auth")
	}
	cfg, err := KubeletTLS{ClientCAFile: caFile}.Config("host-a", "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") }), ReadHeaderTimeout: 5 * time.Second}
	var wg sync.WaitGroup
	wg.Go(func() { _ = srv.Serve(ln) })
	t.Cleanup(func() { _ = srv.Close(); wg.Wait() })
	get := func(certs ...tls.Certificate) error {
		c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true, Certificates: certs}}} //nolint:gosec // the kube-apiserver does not check a kubelet's certificate either
		defer c.CloseIdleConnections()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+ln.Addr().String()+"/", nil)
		resp, err := c.Do(req)
		if err != nil {
			return err
		}
		_ = resp.Body.Close()
		return nil
	}
	if err := get(client(caCert, caKey)); err != nil {
		t.Errorf("a certificate from the CA was refused: %v", err)
	}
	if err := get(); err == nil {
		t.Error("a caller without a certificate got in")
	}
	if err := get(client(nil, nil)); err == nil {
		t.Error("a self-signed client certificate got in")
	}
	// The self-signed serving certificate names the node.
	conn, err := tls.Dial("tcp", ln.Addr().String(), &tls.Config{InsecureSkipVerify: true, Certificates: []tls.Certificate{client(caCert, caKey)}}) //nolint:gosec // reading the certificate only
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	leaf := conn.ConnectionState().PeerCertificates[0]
	if leaf.VerifyHostname("host-a") != nil || leaf.VerifyHostname("127.0.0.1") != nil {
		t.Errorf("serving certificate names %v %v", leaf.DNSNames, leaf.IPAddresses)
	}
}
