package server

import (
	"fmt"
	"strconv"
	"strings"
)

// ByteSize is a flag of bytes: a number with an optional binary suffix (K,
// Ki, KiB, M, Mi, MiB, G, Gi, GiB; all powers of 1024).
type ByteSize int64

// Set parses s.
func (b *ByteSize) Set(s string) error {
	num, mult := splitUnit(strings.TrimSpace(s))
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n < 0 || n > (1<<62)/mult {
		return fmt.Errorf("invalid size %q: want bytes, or a number with KiB, MiB or GiB", s)
	}
	*b = ByteSize(n * mult)
	return nil
}

// units are the suffixes ByteSize accepts, longest first.
var units = []struct {
	suffix string
	mult   int64
}{
	{"GiB", 1 << 30}, {"Gi", 1 << 30}, {"G", 1 << 30},
	{"MiB", 1 << 20}, {"Mi", 1 << 20}, {"M", 1 << 20},
	{"KiB", 1 << 10}, {"Ki", 1 << 10}, {"K", 1 << 10},
	{"B", 1},
}

func splitUnit(s string) (string, int64) {
	for _, u := range units {
		if rest, ok := strings.CutSuffix(s, u.suffix); ok {
			return strings.TrimSpace(rest), u.mult
		}
	}
	return s, 1
}

// String formats b with the largest suffix that divides it.
func (b *ByteSize) String() string {
	n := int64(*b)
	switch {
	case n != 0 && n%(1<<30) == 0:
		return strconv.FormatInt(n>>30, 10) + "GiB"
	case n != 0 && n%(1<<20) == 0:
		return strconv.FormatInt(n>>20, 10) + "MiB"
	case n != 0 && n%(1<<10) == 0:
		return strconv.FormatInt(n>>10, 10) + "KiB"
	}
	return strconv.FormatInt(n, 10)
}

// Type names the flag's type in --help.
func (*ByteSize) Type() string { return "size" }
