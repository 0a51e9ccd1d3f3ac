//go:build ignore

// apply.go writes MUT_FILE with MUT_ORIG replaced by MUT_NEW to MUT_OUT, for
// hack/mutate.sh. "\n" and "\t" in either text stand for a newline and a tab;
// MUT_ORIG must occur exactly once.
package main

import (
	"fmt"
	"os"
	"strings"
)

func main() {
	unescape := strings.NewReplacer(`\n`, "\n", `\t`, "\t").Replace
	src, err := os.ReadFile(os.Getenv("MUT_FILE"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	orig, mut := unescape(os.Getenv("MUT_ORIG")), unescape(os.Getenv("MUT_NEW"))
	if n := strings.Count(string(src), orig); n != 1 {
		fmt.Fprintf(os.Stderr, "%q occurs %d times\n", orig, n)
		os.Exit(1)
	}
	out := strings.Replace(string(src), orig, mut, 1)
	if strings.Contains(mut, "cmp.Or") && !strings.Contains(out, "\"cmp\"") {
		out = strings.Replace(out, "import (\n", "import (\n\t\"cmp\"\n", 1)
	}
	if err := os.WriteFile(os.Getenv("MUT_OUT"), []byte(out), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
}
