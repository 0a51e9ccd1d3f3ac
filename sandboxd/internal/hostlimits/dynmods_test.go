package hostlimits

import (
	"testing"

	"golang.org/x/sys/unix"
)

func TestCgroup2MountRemount(t *testing.T) {
	for _, c := range []struct {
		name, info       string
		ok               bool
		point, source    string
		wantFlags        uintptr
		wantData         string
		alreadyFavouring bool
	}{
		{
			name: "cgroup v2 host (systemd)",
			info: "24 29 0:22 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw\n" +
				"30 24 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n",
			ok: true, point: "/sys/fs/cgroup", source: "cgroup2",
			wantFlags: unix.MS_REMOUNT | unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC | unix.MS_RELATIME,
			wantData:  "nsdelegate,memory_recursiveprot,favordynmods",
		},
		{
			name: "hybrid host: the unified hierarchy",
			info: "35 25 0:30 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n" +
				"44 25 0:39 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n",
			ok: true, point: "/sys/fs/cgroup/unified", source: "cgroup2",
			wantFlags: unix.MS_REMOUNT | unix.MS_RELATIME,
			wantData:  "favordynmods",
		},
		{
			name: "already set",
			info: "30 24 0:26 / /sys/fs/cgroup ro,nosuid shared:9 - cgroup2 none ro,favordynmods\n",
			ok:   true, point: "/sys/fs/cgroup", source: "none",
			wantFlags: unix.MS_REMOUNT | unix.MS_RDONLY | unix.MS_NOSUID,
			wantData:  "favordynmods,favordynmods", alreadyFavouring: true,
		},
		{
			name: "cgroup v1 only",
			info: "35 25 0:30 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n",
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			m, ok := cgroup2Mount(c.info)
			if ok != c.ok {
				t.Fatalf("found %v, want %v", ok, c.ok)
			}
			if !ok {
				return
			}
			if m.point != c.point || m.source != c.source {
				t.Errorf("mount %s from %s, want %s from %s", m.point, m.source, c.point, c.source)
			}
			flags, data := m.remount()
			if flags != c.wantFlags || data != c.wantData {
				t.Errorf("remount flags %#x data %q, want %#x %q", flags, data, c.wantFlags, c.wantData)
			}
			has := false
			for _, o := range m.superOpts {
				has = has || o == DynmodsOption
			}
			if has != c.alreadyFavouring {
				t.Errorf("favordynmods already: %v, want %v", has, c.alreadyFavouring)
			}
		})
	}
}
