package sandboxrt

import (
	"bufio"
	"bytes"
	"log/slog"
	"os"

	"github.com/skiff-dev/skiff/shared/cgroups"
)

// NoSwap reports whether sandboxes' memory cgroups below parent can be
// held to no swap (a limit on memory and swap together equal to the
// memory limit), so that a sandbox's memory limit bounds what it holds in
// swap too: on a host with swap, a sandbox past its limit would otherwise
// be swapped out rather than reclaimed or killed, and fill the host's swap
// for every tenant. When the kernel does not count swap per cgroup and
// the host has swap, it says so in log.
func NoSwap(parent string, log *slog.Logger) bool {
	ok, err := cgroups.SwapAccounted(parent)
	if ok {
		return true
	}
	if err != nil {
		log.Warn("sandboxes' swap is not limited: their memory cgroup's swap accounting cannot be read", "error", err)
	} else if n := hostSwaps(); n > 0 {
		log.Warn("sandboxes' swap is not limited: the host has swap, and its kernel does not count swap per cgroup (boot it with swapaccount=1 on cgroup v1, or use no swap)", "swaps", n)
	}
	return false
}

// hostSwaps is how many swap areas the host has in use (/proc/swaps);
// 0 when it cannot be read.
func hostSwaps() int {
	data, err := os.ReadFile("/proc/swaps")
	if err != nil {
		return 0
	}
	n := -1 // the header
	for s := bufio.NewScanner(bytes.NewReader(data)); s.Scan(); {
		if len(bytes.TrimSpace(s.Bytes())) > 0 {
			n++
		}
	}
	return max(n, 0)
}
