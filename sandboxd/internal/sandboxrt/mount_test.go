package sandboxrt

import "testing"

func TestKernelAtLeast(t *testing.T) {
	for release, want := range map[string]bool{
		"6.8.0-45-generic": true, "6.18.44-fc-v1300": true, "7.0": true, "6.7.12": false,
		"6.1.0-28-amd64": false, "5.15.0-1": false, "": false, "x.y": false,
	} {
		if got := kernelAtLeast(release, 6, 8); got != want {
			t.Errorf("kernelAtLeast(%q, 6, 8) = %v, want %v", release, got, want)
		}
	}
}
