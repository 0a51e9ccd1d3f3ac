package keepalive

import (
	"net/http"
	"testing"
	"time"
)

func TestInterval(t *testing.T) {
	for _, tc := range []struct {
		value string
		want  time.Duration
	}{
		{"", Default},
		{"50", 50 * time.Second},
		{"0.5", 500 * time.Millisecond},
		{"0", Default},
		{"-3", Default},
		{"NaN", Default},
		{"Inf", Default},
		{"1e9", Default},
		{"86400", 24 * time.Hour},
		{"ten", Default},
	} {
		h := http.Header{}
		if tc.value != "" {
			h.Set(Header, tc.value)
		}
		if got := Interval(h); got != tc.want {
			t.Errorf("Interval(%q) = %s, want %s", tc.value, got, tc.want)
		}
	}
}
