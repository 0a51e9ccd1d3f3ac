package native_test

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/skiff-dev/skiff/sandboxd/internal/sandboxrt"
	"github.com/skiff-dev/skiff/sandboxd/internal/sandboxrt/native"
)

// insideView is what a sandbox's processes see of how its init set it up:
// its envd's (pid 1's) identity, capabilities, filter and limits, a
// command's (envd's child's), its environment, the mounts, /dev, and the modes of the directories the
// init makes, with what differs between any two sandboxes (mount IDs,
// device numbers, the sandbox's ID and paths) taken out.
const insideView = `
grep -E '^(Umask|Uid|Gid|Groups|NoNewPrivs|Seccomp|Seccomp_filters|Cap(Inh|Prm|Eff|Bnd|Amb)):' /proc/1/status
grep -E '^(Umask|Uid|Gid|Groups|NoNewPrivs|Seccomp|Seccomp_filters|Cap(Inh|Prm|Eff|Bnd|Amb)):' /proc/self/status
env | sort
cat /proc/1/limits /proc/1/oom_score_adj
ls /proc/1/fd | wc -l
hostname; pwd
cat /proc/self/uid_map
awk '{ $1 = $2 = $3 = ""; print }' /proc/self/mountinfo
ls -la /dev | awk '{print $1, $3, $4, $NF}'
stat -c '%n %a %u %g %F' / /dev /dev/pts /dev/shm /dev/mqueue /proc /usr/bin/envd
`

func TestCInitSetsUpTheSandboxAsTheGoInit(t *testing.T) {
	views := map[bool]string{}
	for _, goInit := range []bool{true, false} {
		rt, dir := newRuntime(t, func(o *native.Options) { o.GoInit = goInit })
		s := start(t, rt, dir, nil)
		if inC := rt.InitInC(s.spec.ID); inC == goInit {
			t.Fatalf("GoInit %v: the init was done in C: %v", goInit, inC)
		}
		got := s.run(t, "root", insideView)
		if got.Stderr != "" || got.ExitCode != 0 {
			t.Fatalf("GoInit %v: %+v", goInit, got)
		}
		view := strings.ReplaceAll(got.Stdout, s.spec.ID, "<id>")
		view = strings.ReplaceAll(view, s.spec.Hostname, "<hostname>")
		view = strings.ReplaceAll(view, dir, "<dir>")
		// The peer groups of mounts are numbered by the host, loop
		// devices too, and the sandboxes' IDs on the host differ.
		view = regexp.MustCompile(`(master|shared|propagate_from):[0-9]+`).ReplaceAllString(view, "$1:N")
		view = regexp.MustCompile(`/dev/loop[0-9]+`).ReplaceAllString(view, "/dev/loopN")
		// The overlay's layers are named by sandboxd's descriptors.
		view = regexp.MustCompile(`/proc/self/fd/[0-9]+`).ReplaceAllString(view, "/proc/self/fd/N")
		if m := regexp.MustCompile(`(?m)^\s*0\s+([0-9]+)\s+[0-9]+$`).FindStringSubmatch(view); m != nil {
			base, _ := strconv.Atoi(m[1])
			view = strings.Replace(view, m[0], strings.Replace(m[0], m[1], "base", 1), 1)
			view = regexp.MustCompile(`\b(uid|gid)=[0-9]+`).ReplaceAllStringFunc(view, func(kv string) string {
				k, n, _ := strings.Cut(kv, "=")
				v, _ := strconv.Atoi(n)
				return k + "=base+" + strconv.Itoa(v-base)
			})
		} else {
			t.Fatalf("GoInit %v: no uid_map in %q", goInit, view)
		}
		views[goInit] = view
		if err := rt.Stop(t.Context(), s.spec.ID); err != nil {
			t.Fatal(err)
		}
	}
	if views[true] != views[false] {
		t.Errorf("the C init set the sandbox up otherwise than the Go init:\n%s", lineDiff(views[true], views[false]))
	}
	t.Logf("inside view:\n%s", views[false])
}

// A sandbox with a volume (an ID-mapped mount, which only the Go init
// makes) gets the Go init, and its volume.
func TestCInitLeavesVolumesToTheGoInit(t *testing.T) {
	rt, dir := newRuntime(t)
	vol := t.TempDir()
	if err := os.WriteFile(filepath.Join(vol, "f"), []byte("in the volume\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	s := start(t, rt, dir, func(sp *sandboxrt.Spec) {
		sp.Volumes = []sandboxrt.Volume{{Source: vol, Path: "/mnt/vol"}}
	})
	if rt.InitInC(s.spec.ID) {
		t.Error("a sandbox with a volume was set up by the C init")
	}
	if got := s.run(t, "root", "cat /mnt/vol/f"); got.Stdout != "in the volume\n" {
		t.Errorf("volume: %+v", got)
	}
	// The next sandbox without one gets the C init again.
	if s2 := start(t, rt, dir, nil); !rt.InitInC(s2.spec.ID) {
		t.Error("a sandbox without volumes was set up by the Go init")
	}
}

// A step of the C init that fails fails the start with the init's reason,
// as the Go init's would, and leaves nothing behind.
func TestCInitReportsAFailedStep(t *testing.T) {
	rt, dir := newRuntime(t)
	spec := newSpec(t, dir)
	spec.Hostname = strings.Repeat("h", 65) // past the kernel's 64
	err := rt.Start(t.Context(), spec)
	if err == nil || !strings.Contains(err.Error(), "sethostname: Invalid argument") {
		t.Fatalf("start: %v, want the init's sethostname error", err)
	}
	if ids, err := rt.List(t.Context()); err != nil || slices.Contains(ids, spec.ID) {
		t.Errorf("after the failed start: %v, %v", ids, err)
	}
}

// A root whose envd path is a symlink into /proc would have the init bind
// envd over a file of the sandbox's procfs (cap_last_cap: the init in C
// once read the last capability there). Both inits refuse the mount.
func TestAnImagesSymlinkMountsNothingIntoProc(t *testing.T) {
	for _, goInit := range []bool{true, false} {
		rt, dir := newRuntime(t, func(o *native.Options) { o.GoInit = goInit })
		spec := newSpec(t, dir)
		envd := filepath.Join(spec.Rootfs, "usr/bin/envd")
		_ = os.Remove(envd)
		if err := os.Symlink("/proc/sys/kernel/cap_last_cap", envd); err != nil {
			t.Fatal(err)
		}
		err := rt.Start(t.Context(), spec)
		if err == nil {
			_ = rt.Stop(t.Context(), spec.ID)
			t.Errorf("GoInit %v: started a sandbox with envd bound into /proc", goInit)
		} else if !strings.Contains(err.Error(), "inside /proc") {
			t.Errorf("GoInit %v: start: %v, want refused as inside /proc", goInit, err)
		}
	}
}

// lineDiff lists the lines only in a (-) and only in b (+).
func lineDiff(a, b string) string {
	in := func(s string) map[string]int {
		m := map[string]int{}
		for _, l := range strings.Split(s, "\n") {
			m[l]++
		}
		return m
	}
	ma, mb := in(a), in(b)
	var out strings.Builder
	for _, l := range strings.Split(a, "\n") {
		if mb[l] == 0 {
			out.WriteString("- " + l + "\n")
		}
	}
	for _, l := range strings.Split(b, "\n") {
		if ma[l] == 0 {
			out.WriteString("+ " + l + "\n")
		}
	}
	if out.Len() == 0 {
		return "(the same lines, in another order)\n"
	}
	return out.String()
}
