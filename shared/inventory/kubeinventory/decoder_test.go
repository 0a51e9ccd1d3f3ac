package kubeinventory

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/skiff-dev/skiff/api/v1beta1"
)

// packedEntry is a valid running entry whose metadata holds value.
func packedEntry(id, value string) v1beta1.SandboxEntry {
	return v1beta1.SandboxEntry{ID: id, Template: "base", State: v1beta1.SandboxRunning, Team: "team-a",
		StartedAt: v1beta1.NewMicroTime(time.Date(2026, 12, 5, 10, 0, 0, 20_345_000, time.UTC)), Metadata: map[string]string{"k": value}}
}

// Packed entries keep their times' microseconds, decoded afresh or taken
// from the last decode.
func TestPackedDecoderKeepsMicroseconds(t *testing.T) {
	e := packedEntry("aaaaaaaaaaaaaaaaaaaa", "x")
	end := v1beta1.NewMicroTime(e.StartedAt.Add(time.Hour + 789*time.Microsecond))
	e.EndAt = &end
	packed := mustPack(t, e)
	var d packedDecoder
	for _, pass := range []string{"first", "second"} {
		got, err := d.decode(packed)
		if err != nil || len(got) != 1 || !reflect.DeepEqual(got[0], e) {
			t.Fatalf("%s decode = %+v, %v; want %+v", pass, got, err, e)
		}
	}
}

// mustPack is PackSandboxes of entries.
func mustPack(t testing.TB, entries ...v1beta1.SandboxEntry) string {
	t.Helper()
	packed, err := v1beta1.PackSandboxes(entries)
	if err != nil {
		t.Fatal(err)
	}
	return packed
}

// sameDecode fails t unless the decoder's answer for packed is the
// whole decode's (v1beta1.UnpackSandboxes): the same entries, and an error
// just when it has one.
func sameDecode(t *testing.T, d *packedDecoder, packed string) []v1beta1.SandboxEntry {
	t.Helper()
	got, gotErr := d.decode(packed)
	want, wantErr := v1beta1.UnpackSandboxes(packed)
	if (gotErr == nil) != (wantErr == nil) {
		t.Fatalf("Decode(%q): error %v, the whole decode's %v", packed, gotErr, wantErr)
	}
	if len(got) != len(want) || len(got) > 0 && !reflect.DeepEqual(got, want) {
		t.Fatalf("Decode(%q) = %+v, the whole decode = %+v", packed, got, want)
	}
	return got
}

// A second decode takes the entries whose JSON it saw last time from its
// last decode (their metadata is the same map) and decodes only the new
// ones; what it returns is the whole decode's either way.
func TestDecoderReusesTheEntriesItSaw(t *testing.T) {
	a, b, c := packedEntry("aaaaaaaaaaaaaaaaaaaa", "1"), packedEntry("bbbbbbbbbbbbbbbbbbbb", "1"), packedEntry("cccccccccccccccccccc", "1")
	var d packedDecoder
	first := sameDecode(t, &d, mustPack(t, a, b))
	b2 := packedEntry("bbbbbbbbbbbbbbbbbbbb", "2")
	second := sameDecode(t, &d, mustPack(t, a, b2, c))
	mapOf := func(e v1beta1.SandboxEntry) uintptr { return reflect.ValueOf(e.Metadata).Pointer() }
	if mapOf(second[0]) != mapOf(first[0]) {
		t.Error("an entry carried over was decoded again")
	}
	if mapOf(second[1]) == mapOf(first[1]) || second[1].Metadata["k"] != "2" {
		t.Error("a changed entry was taken from the last decode")
	}
	// An invalid entry is dropped, with an error, every time.
	bad := packedEntry("dddddddddddddddddddd", "1")
	bad.Team = ""
	for range 2 {
		if got, err := d.decode(mustPack(t, a, bad)); err == nil || len(got) != 1 || got[0].ID != a.ID {
			t.Fatalf("with an invalid entry: %+v, %v", got, err)
		}
	}
}

// Whatever the packed text, the decoder answers as the whole decode does,
// after any text before it.
func FuzzDecoder(f *testing.F) {
	a, b := packedEntry("aaaaaaaaaaaaaaaaaaaa", `{"x":[1]} \"quoted\" \\`), packedEntry("bbbbbbbbbbbbbbbbbbbb", "}]")
	bad := packedEntry("cccccccccccccccccccc", "v")
	bad.State = "lost"
	ab := mustPack(f, a, b)
	for _, seed := range [][2]string{
		{"", ab}, {ab, ab}, {ab, mustPack(f, b, a, bad)}, {ab, "[]"}, {"[]", ""},
		{ab, strings.Replace(ab, "},{", "}, {", 1)}, {ab, ab[:len(ab)-1]}, {ab, ab + " "},
		{ab, `[{"id":5}]`}, {ab, `[{"id":"aaaaaaaaaaaaaaaaaaaa"}`}, {ab, `[{},{}]`}, {ab, `[{}]x`}, {ab, `[1]`}, {ab, `[{]`},
	} {
		f.Add(seed[0], seed[1])
	}
	f.Fuzz(func(t *testing.T, before, packed string) {
		var d packedDecoder
		sameDecode(t, &d, before)
		sameDecode(t, &d, packed)
		sameDecode(t, &d, packed)
	})
}
