package publish

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/skiff-dev/skiff/api/v1beta1"
	"github.com/skiff-dev/skiff/shared/testing/kubetest"
)

// BenchmarkWriteServerCost measures what one inventory write costs the
// control plane: the CPU milliseconds kube-apiserver and etcd spend per
// write (read from /proc, reported as apiserver-ms/op and etcd-ms/op),
// for an inventory of 0, 500 and 2,000 sandboxes (and 2,000 in 16 shards,
// structured, packed, and packed with up to 256 changes carried in the
// inventory) shaped like a real host's (a team, a deadline, two metadata
// entries each):
//
//   - apply: one entry changed, the whole inventory applied (sharded: the
//     inventory and the one shard that changed; with changes carried, the
//     inventory with them, and every 256th apply a fold);
//   - stamp: publishedAt alone, as a publish of an unchanged spec.
//
// With PPROF_OUT=file it also writes kube-apiserver's CPU profile of 15 s
// of stamp/2000 there.
func BenchmarkWriteServerCost(b *testing.B) {
	env := kubetest.Start(b)
	etcdPID, apiPID, err := env.PIDs()
	if err != nil {
		b.Fatal(err)
	}
	dyn := dynamic.NewForConfigOrDie(env.Config)
	for _, c := range []struct {
		n    int
		opts Options
	}{
		{0, Options{}}, {500, Options{}}, {2000, Options{}},
		{2000, Options{SandboxShards: DefaultSandboxShards, ShardFormat: ShardsStructured}},
		{2000, Options{SandboxShards: DefaultSandboxShards, ShardFormat: ShardsPacked}},
		{2000, Options{SandboxShards: DefaultSandboxShards, ShardFormat: ShardsPacked, MaxChanges: DefaultMaxChanges}},
	} {
		n := c.n
		name := fmt.Sprint(n)
		if c.opts.SandboxShards > 0 {
			name += fmt.Sprintf("-in-%d-%s-shards", c.opts.SandboxShards, c.opts.ShardFormat)
		}
		if c.opts.MaxChanges > 0 {
			name += fmt.Sprintf("-changes-%d", c.opts.MaxChanges)
		}
		node := "cost-" + name
		inv := costInventory(node, n)
		w := NewKubeWriter(dyn, c.opts)
		if err := w.Apply(b.Context(), inv); err != nil {
			b.Fatal(err)
		}
		for _, bc := range []struct {
			name  string
			write func(ctx context.Context, i int) error
		}{
			{"apply", func(ctx context.Context, i int) error {
				if n > 0 {
					end := v1beta1.NewMicroTime(inv.Spec.Sandboxes[i%n].EndAt.Add(time.Second))
					inv.Spec.Sandboxes[i%n].EndAt = &end
				} else {
					inv.Spec.Allocated.Sandboxes = int32(i % 2)
				}
				return w.Apply(ctx, inv)
			}},
			{"stamp", func(ctx context.Context, i int) error {
				at := metav1.NewTime(inv.PublishedAt.Add(time.Duration(i+1) * time.Second))
				inv.PublishedAt = &at
				return w.Stamp(ctx, inv)
			}},
		} {
			b.Run(bc.name+"/"+name, func(b *testing.B) {
				if bc.name == "stamp" && name == "2000" {
					profileKubeAPIServer(b, env, 15)
				}
				measureServerCost(b, apiPID, etcdPID, bc.write)
			})
		}
	}
}

// profileKubeAPIServer writes, with PPROF_OUT=file, kube-apiserver's CPU
// profile of the next seconds there, in the background.
func profileKubeAPIServer(b *testing.B, env *kubetest.Env, seconds int) {
	out := os.Getenv("PPROF_OUT")
	if out == "" {
		return
	}
	go func() {
		rc := kubernetes.NewForConfigOrDie(env.Config).Discovery().RESTClient()
		raw, err := rc.Get().AbsPath("/debug/pprof/profile").Param("seconds", strconv.Itoa(seconds)).DoRaw(context.Background())
		if err != nil {
			b.Log(err)
		}
		_ = os.WriteFile(out, raw, 0o644)
	}()
}

// measureServerCost runs write (with its iteration) b.N times and reports
// the CPU milliseconds kube-apiserver (apiPID) and etcd (etcdPID) spent
// per write.
func measureServerCost(b *testing.B, apiPID, etcdPID int, write func(ctx context.Context, i int) error) {
	api0, etcd0 := procCPU(b, apiPID), procCPU(b, etcdPID)
	i := 0
	for b.Loop() {
		if err := write(b.Context(), i); err != nil {
			b.Fatal(err)
		}
		i++
	}
	b.ReportMetric(float64((procCPU(b, apiPID)-api0).Microseconds())/1e3/float64(b.N), "apiserver-ms/op")
	b.ReportMetric(float64((procCPU(b, etcdPID)-etcd0).Microseconds())/1e3/float64(b.N), "etcd-ms/op")
}

// costInventory is a host's inventory of n sandboxes, shaped like a real
// one's.
func costInventory(node string, n int) *v1beta1.NodeInventory {
	now := metav1.NewTime(time.Now().Truncate(time.Second))
	inv := &v1beta1.NodeInventory{
		ObjectMeta:  metav1.ObjectMeta{Name: node},
		PublishedAt: &now,
		Spec: v1beta1.NodeInventorySpec{
			Endpoint:  "10.0.0.1:27777",
			Capacity:  v1beta1.NodeCapacity{CPUMilli: 64000, MemoryMiB: 262144, Sandboxes: 4096},
			Templates: []v1beta1.TemplateVersion{{Name: "base", Version: "v1"}},
		},
	}
	for i := range n {
		end := v1beta1.NewMicroTime(now.Add(time.Hour))
		inv.Spec.Sandboxes = append(inv.Spec.Sandboxes, v1beta1.SandboxEntry{
			ID: fmt.Sprintf("%015d%05d", i, n)[:20], Template: "base", State: v1beta1.SandboxRunning,
			Team: fmt.Sprintf("team-%02d", i%20), StartedAt: v1beta1.NewMicroTime(now.Time), EndAt: &end, CPUMilli: 2000, MemoryMiB: 512, DiskMiB: 1024,
			Metadata: map[string]string{"user": fmt.Sprintf("u-%05d", i), "node": node},
		})
	}
	return inv
}

// procCPU is the CPU time (user + system) process pid has used.
func procCPU(b *testing.B, pid int) time.Duration {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	// Fields after the command (which may hold spaces) start at state;
	// utime and stime are the 14th and 15th fields, in clock ticks (100 Hz).
	f := strings.Fields(string(raw[strings.LastIndexByte(string(raw), ')')+2:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * 10 * time.Millisecond
}
