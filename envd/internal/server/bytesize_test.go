package server

import "testing"

func TestByteSize(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		str  string
		err  bool
	}{
		{"0", 0, "0", false},
		{"1000", 1000, "1000", false},
		{"4KiB", 4 << 10, "4KiB", false},
		{"16Mi", 16 << 20, "16MiB", false},
		{"2 G", 2 << 30, "2GiB", false},
		{"1536K", 1536 << 10, "1536KiB", false},
		{"10B", 10, "10", false},
		{"", 0, "", true},
		{"-1", 0, "", true},
		{"1.5MiB", 0, "", true},
		{"lots", 0, "", true},
		{"99999999999GiB", 0, "", true},
	} {
		var b ByteSize
		err := b.Set(tc.in)
		if (err != nil) != tc.err {
			t.Errorf("Set(%q) = %v, want error %v", tc.in, err, tc.err)
			continue
		}
		if !tc.err && (int64(b) != tc.want || b.String() != tc.str) {
			t.Errorf("Set(%q) = %d %q, want %d %q", tc.in, b, b.String(), tc.want, tc.str)
		}
	}
}
