package hostlimits

import (
	"slices"
	"testing"
)

func TestCgroup2MountOptions(t *testing.T) {
	for _, c := range []struct {
		name, info    string
		ok            bool
		point, source string
		want          []string
		already       bool
	}{
		{
			name: "cgroup v2 host (systemd)",
			info: "24 29 0:22 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw\n" +
				"30 24 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,seclabel,nsdelegate,memory_recursiveprot\n",
			ok: true, point: "/sys/fs/cgroup", source: "cgroup2",
			want: []string{"nsdelegate", "memory_recursiveprot", "favordynmods"},
		},
		{
			name: "hybrid host: the unified hierarchy, mounted read-only",
			info: "35 25 0:30 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n" +
				"44 25 0:39 / /sys/fs/cgroup/unified ro,nosymfollow,relatime - cgroup2 cgroup2 ro\n",
			ok: true, point: "/sys/fs/cgroup/unified", source: "cgroup2",
			want: []string{"favordynmods"},
		},
		{
			name: "a mount point with a space",
			info: "30 24 0:26 / /run/my\\040cgroup rw shared:9 - cgroup2 none rw,favordynmods\n",
			ok:   true, point: "/run/my cgroup", source: "none",
			want: []string{"favordynmods", "favordynmods"}, already: true,
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
				t.Errorf("mount %q from %s, want %q from %s", m.point, m.source, c.point, c.source)
			}
			if got := m.options(); !slices.Equal(got, c.want) {
				t.Errorf("options %q, want %q", got, c.want)
			}
			if got := slices.Contains(m.superOpts, DynmodsOption); got != c.already {
				t.Errorf("favordynmods already: %v, want %v", got, c.already)
			}
		})
	}
}
