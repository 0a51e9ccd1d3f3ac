package v1beta1

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	cbor "k8s.io/apimachinery/pkg/runtime/serializer/cbor/direct"
)

// An entry's times keep their microseconds through JSON, structured or
// packed, and both sides of an upgrade read the other's: an entry in whole
// seconds (an older host's) reads as those seconds, and a reader whose
// entry has metav1.Time (an older apiserver or proxy) reads a new entry.
func TestEntryTimesMicroseconds(t *testing.T) {
	start := time.Date(2026, 12, 5, 10, 0, 1, 20_345_678, time.UTC) // nanoseconds past the microsecond
	end := start.Add(time.Hour)
	wantStart, wantEnd := start.Truncate(time.Microsecond), end.Truncate(time.Microsecond)
	endAt := NewMicroTime(end)
	e := SandboxEntry{ID: "abcdefghij0123456789", Template: "base", State: SandboxRunning, Team: "t",
		StartedAt: NewMicroTime(start), EndAt: &endAt}
	if !e.StartedAt.Time.Equal(wantStart) {
		t.Fatalf("NewMicroTime(%v) = %v, want it truncated to %v", start, e.StartedAt, wantStart)
	}

	raw, err := json.Marshal(e)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(raw), `"startedAt":"2026-12-05T10:00:01.020345Z"`) ||
		!strings.Contains(string(raw), `"endAt":"2026-12-05T11:00:01.020345Z"`) {
		t.Fatalf("entry JSON %s: want its times in microseconds", raw)
	}
	var back SandboxEntry
	if err := json.Unmarshal(raw, &back); err != nil {
		t.Fatal(err)
	}
	if !equality.Semantic.DeepEqual(back, e) {
		t.Errorf("round trip: %+v, want %+v (the publisher compares entries so)", back, e)
	}

	packed, err := PackSandboxes([]SandboxEntry{e})
	if err != nil {
		t.Fatal(err)
	}
	unpacked, err := UnpackSandboxes(packed)
	if err != nil || len(unpacked) != 1 {
		t.Fatalf("UnpackSandboxes = %d entries, %v", len(unpacked), err)
	}
	if !equality.Semantic.DeepEqual(unpacked[0], e) {
		t.Errorf("packed: %+v, want %+v", unpacked[0], e)
	}

	u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&e)
	if err != nil {
		t.Fatal(err)
	}
	if u["startedAt"] != "2026-12-05T10:00:01.020345Z" || u["endAt"] != "2026-12-05T11:00:01.020345Z" {
		t.Errorf("unstructured: startedAt %v, endAt %v", u["startedAt"], u["endAt"])
	}
	var fromU SandboxEntry
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u, &fromU); err != nil || !equality.Semantic.DeepEqual(fromU, e) {
		t.Errorf("from unstructured: %+v, %v; want %+v", fromU, err, e)
	}

	c, err := cbor.Marshal(e)
	if err != nil {
		t.Fatal(err)
	}
	var fromC SandboxEntry
	if err := cbor.Unmarshal(c, &fromC); err != nil || !equality.Semantic.DeepEqual(fromC, e) {
		t.Errorf("CBOR round trip: %+v, %v; want %+v", fromC, err, e)
	}

	// A reader that has the times as metav1.Time (whole seconds in its own
	// JSON) reads the new ones, to the microsecond even (time.Parse takes
	// the fraction that RFC 3339's layout does not name).
	var old struct {
		StartedAt metav1.Time  `json:"startedAt"`
		EndAt     *metav1.Time `json:"endAt,omitempty"`
	}
	if err := json.Unmarshal(raw, &old); err != nil {
		t.Fatalf("an old reader: %v", err)
	}
	if !old.StartedAt.Time.Equal(wantStart) || old.EndAt == nil || !old.EndAt.Time.Equal(wantEnd) {
		t.Errorf("an old reader: %v, %v; want %v, %v", old.StartedAt, old.EndAt, wantStart, wantEnd)
	}

	// An older host's entry, in whole seconds, which metav1.MicroTime
	// would refuse.
	oldRaw := `{"id":"abcdefghij0123456789","template":"base","state":"running","team":"t",` +
		`"startedAt":"2026-12-05T10:00:01Z","endAt":"2026-12-05T11:00:01Z"}`
	var strict struct {
		StartedAt metav1.MicroTime `json:"startedAt"`
	}
	if err := json.Unmarshal([]byte(oldRaw), &strict); err == nil {
		t.Log("metav1.MicroTime now reads whole seconds: v1beta1.MicroTime is no longer needed for that")
	}
	var fromOld SandboxEntry
	if err := json.Unmarshal([]byte(oldRaw), &fromOld); err != nil {
		t.Fatalf("an old entry: %v", err)
	}
	second := start.Truncate(time.Second)
	if !fromOld.StartedAt.Time.Equal(second) || fromOld.EndAt == nil || !fromOld.EndAt.Time.Equal(second.Add(time.Hour)) {
		t.Errorf("an old entry: %v, %v; want %v and an hour later", fromOld.StartedAt, fromOld.EndAt, second)
	}
	if unpacked, err := UnpackSandboxes("[" + oldRaw + "]"); err != nil || len(unpacked) != 1 || !unpacked[0].StartedAt.Time.Equal(second) {
		t.Errorf("an old packed entry: %v, %v", unpacked, err)
	}
	fromOld = SandboxEntry{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(map[string]any{"startedAt": "2026-12-05T10:00:01Z"}, &fromOld); err != nil || !fromOld.StartedAt.Time.Equal(second) {
		t.Errorf("an old entry from unstructured: %v, %v", fromOld.StartedAt, err)
	}

	// Nothing, or not a time.
	var zero SandboxEntry
	if err := json.Unmarshal([]byte(`{"startedAt":null}`), &zero); err != nil || !zero.StartedAt.IsZero() {
		t.Errorf("null: %v, %v", zero.StartedAt, err)
	}
	if raw, err := json.Marshal(MicroTime{}); err != nil || string(raw) != "null" {
		t.Errorf("the zero time: %s, %v; want null", raw, err)
	}
	if err := json.Unmarshal([]byte(`{"startedAt":"yesterday"}`), &zero); err == nil {
		t.Error("read a startedAt that is not RFC 3339")
	}
}
