package main

import (
	"io"
	"testing"
)

func TestRunFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want int
	}{
		{[]string{"--version"}, 0},
		{[]string{"--help"}, 0},
		{[]string{"--no-such-flag"}, 2},
		{[]string{"--port", "70000"}, 2},
		{[]string{"--log-output-limit", "0"}, 2},
		{[]string{"--log-limit", "lots"}, 2},
	} {
		if got := run(tc.args, io.Discard); got != tc.want {
			t.Errorf("run(%v) = %d, want %d", tc.args, got, tc.want)
		}
	}
}
