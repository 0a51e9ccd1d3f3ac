package publish

import (
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/skiff-dev/skiff/api/v1beta1"
)

// maxEntryBytes bounds an entry at every bound of the CRD, with every
// character of its strings one that JSON escapes to 6 bytes.
func TestMaxEntryBytes(t *testing.T) {
	esc := func(n int) string { return strings.Repeat("<", n) }
	end := v1beta1.NewMicroTime(time.Date(9999, 12, 31, 23, 59, 59, 999999000, time.FixedZone("", -(23*3600+59*60))))
	full := v1beta1.SandboxEntry{
		ID: strings.Repeat("a", 20), Template: esc(63), State: v1beta1.SandboxRunning, Pool: esc(317), Team: esc(63),
		StartedAt: end, EndAt: &end, CPUMilli: math.MinInt64, MemoryMiB: math.MinInt64, DiskMiB: math.MinInt64, EnvdVersion: esc(32),
	}
	metadata := map[string]map[string]string{
		"one longest key":      {esc(64): esc(128)},
		"eight shortest pairs": {},
	}
	for i := range 8 {
		metadata["eight shortest pairs"][fmt.Sprint(i)] = esc(23)
	}
	for name, m := range metadata {
		e := full
		e.Metadata = m
		raw, err := json.Marshal([]v1beta1.SandboxEntry{e, e})
		if err != nil {
			t.Fatal(err)
		}
		// Two entries and the array's brackets: each entry and its comma.
		if per := (len(raw) - 1) / 2; per > maxEntryBytes {
			t.Errorf("%s: an entry takes %d bytes of JSON, over maxEntryBytes (%d)", name, per, maxEntryBytes)
		} else {
			t.Logf("%s: %d bytes of JSON an entry, of %d", name, per, maxEntryBytes)
		}
	}
}
