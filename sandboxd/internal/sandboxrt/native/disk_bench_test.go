package native

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/skiff-dev/skiff/sandboxd/internal/diskimage"
	"github.com/skiff-dev/skiff/sandboxd/internal/layer"
)

// BenchmarkAttachDisk is the disk part of a sandbox's start: the sparse
// copy of the empty image, the loop device and the mount (the empty image
// of the size made beforehand, as after the first sandbox of that size).
func BenchmarkAttachDisk(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root")
	}
	dir := b.TempDir()
	r := &Runtime{golden: &diskimage.Golden{Dir: filepath.Join(dir, "disks"), Format: diskFormat}}
	if _, err := r.golden.Get(10240); err != nil {
		b.Fatal(err)
	}
	var copyT, mountT time.Duration
	for i := 0; b.Loop(); i++ {
		sb := filepath.Join(dir, "sb", time.Now().Format("150405.000000000"))
		if err := os.MkdirAll(sb, 0o700); err != nil {
			b.Fatal(err)
		}
		golden, _ := r.golden.Get(10240)
		t0 := time.Now()
		if err := layer.CopySparse(golden, filepath.Join(sb, diskImage)); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if err := os.Mkdir(filepath.Join(sb, diskMount), 0o700); err != nil {
			b.Fatal(err)
		}
		if err := diskimage.Mount(filepath.Join(sb, diskImage), filepath.Join(sb, diskMount), diskFormat.MountData); err != nil {
			b.Fatal(err)
		}
		t2 := time.Now()
		copyT += t1.Sub(t0)
		mountT += t2.Sub(t1)
		b.StopTimer()
		if err := detachDisk(sb); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(copyT.Microseconds())/float64(b.N)/1000, "copy-ms")
	b.ReportMetric(float64(mountT.Microseconds())/float64(b.N)/1000, "loop+mount-ms")
}
