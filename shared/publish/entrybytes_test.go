package publish

import (
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/skiff-dev/skiff/api/v1beta1"
)

// entryBound bounds what entries take in a stored shard, whatever their
// strings hold, and storedBytes is what the packed text takes as a string
// of the stored object.
func TestEntryBound(t *testing.T) {
	end := v1beta1.NewMicroTime(time.Date(9999, 12, 31, 23, 59, 59, 999999000, time.FixedZone("", -(23*3600+59*60))))
	longest := func(c string) v1beta1.SandboxEntry {
		rep := func(n int) string { return strings.Repeat(c, n) }
		e := v1beta1.SandboxEntry{
			ID: rep(20), Template: rep(63), State: v1beta1.SandboxRunning, Pool: rep(317), Team: rep(63),
			StartedAt: end, EndAt: &end, PausedAt: &end, CPUMilli: math.MinInt64, MemoryMiB: math.MinInt64, DiskMiB: math.MinInt64, EnvdVersion: rep(32),
			Metadata: map[string]string{},
		}
		for i, k := range []int{1, 2, 3, 4, 5, 6, 7, 8} {
			e.Metadata[rep(k)+strings.Repeat("\x00", i)] = rep(10)
		}
		return e
	}
	cases := map[string][]v1beta1.SandboxEntry{
		"nothing but the fixed part": {{StartedAt: end, EndAt: &end, PausedAt: &end, CPUMilli: math.MinInt64, MemoryMiB: math.MinInt64, DiskMiB: math.MinInt64}},
		"an ordinary entry": {{ID: "abcdefghij0123456789", Template: "base", State: v1beta1.SandboxRunning, Team: "team-a",
			StartedAt: end, Metadata: map[string]string{"purpose": "tests"}}},
		"a version of 100 KB, past the CRD": {{ID: "abcdefghij0123456789", EnvdVersion: strings.Repeat(`"`, 100<<10), StartedAt: end}},
	}
	for name, c := range map[string]string{"<": "escaped as \\u003c", `"`: "a quote", `\`: "a backslash", "\x01": "a control character",
		"\xff": "invalid UTF-8", "\u2028": "a line separator", "é": "two bytes, as they are"} {
		e := longest(name)
		cases["every string at its longest, of "+c] = []v1beta1.SandboxEntry{e, e, e}
	}
	for name, entries := range cases {
		packed, err := v1beta1.PackSandboxes(entries)
		if err != nil {
			t.Fatal(err)
		}
		quoted, err := json.Marshal(packed)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := storedBytes(packed), len(quoted)-2; got != want {
			t.Errorf("%s: storedBytes = %d, but the packed text takes %d as a JSON string", name, got, want)
		}
		bound := 0
		for i := range entries {
			bound += entryBound(&entries[i])
		}
		if bound < storedBytes(packed) {
			t.Errorf("%s: entryBound sums to %d, under the %d bytes the entries take stored", name, bound, storedBytes(packed))
		} else {
			t.Logf("%s: %d bytes stored, bound %d", name, storedBytes(packed), bound)
		}
	}
}
