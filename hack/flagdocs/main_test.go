package main

import (
	"strings"
	"testing"
)

const cobraHelp = `Serve the e2b REST API.

Usage:
  sandbox-apiserver serve [flags]

Flags:
      --admin-listen string     Address of the operations endpoints. (default "127.0.0.1:9090")
      --enable-pprof            Serve Go's profiles.
      --init[=true|false]       Act as init.
  -h, --help                    help for serve
      --max-timeout duration    Longest lifetime a sandbox may be given. (default 24h0m0s)
      --sandboxd strings        A sandboxd's host:port | several.
      --multi string            First line
                                second line. (default "x")

Global Flags:
      --state-dir string   Directory of the state. (default "/var/lib/x")
`

func TestParseReadsPflagsUsage(t *testing.T) {
	got := parse(cobraHelp)
	want := []flag{
		{name: "admin-listen", typ: "string", def: `"127.0.0.1:9090"`, usage: "Address of the operations endpoints."},
		{name: "enable-pprof", usage: "Serve Go's profiles."},
		{name: "init", usage: "Act as init."},
		{name: "max-timeout", typ: "duration", def: "24h0m0s", usage: "Longest lifetime a sandbox may be given."},
		{name: "sandboxd", typ: "strings", usage: "A sandboxd's host:port | several."},
		{name: "multi", typ: "string", def: `"x"`, usage: "First line second line."},
		// A persistent flag of the root: every subcommand takes it.
		{name: "state-dir", typ: "string", def: `"/var/lib/x"`, usage: "Directory of the state."},
	}
	if len(got) != len(want) {
		t.Fatalf("parsed %d flags, want %d: %+v", len(got), len(want), got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("flag %d = %+v, want %+v", i, got[i], want[i])
		}
	}
	tab := table(got)
	for _, s := range []string{"| `--admin-listen string` | `127.0.0.1:9090` | Address of the operations endpoints. |", `host:port \| several.`} {
		if !strings.Contains(tab, s) {
			t.Errorf("table lacks %q:\n%s", s, tab)
		}
	}
}

func TestRewriteKeepsProseAndReplacesTables(t *testing.T) {
	doc := "# Title\n\nprose\n\n<!-- flags: apiserver ./cmd/x serve -->\n| old | table |\n<!-- /flags -->\n\nmore prose\n"
	var asked []string
	got, err := rewrite(doc, func(module string, argv []string) (string, error) {
		asked = append(asked, module+" "+strings.Join(argv, " "))
		return cobraHelp, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(asked) != 1 || asked[0] != "apiserver ./cmd/x serve" {
		t.Errorf("asked %q", asked)
	}
	if strings.Contains(got, "| old | table |") || !strings.Contains(got, "`--max-timeout duration`") ||
		!strings.HasPrefix(got, "# Title\n\nprose\n\n<!-- flags: apiserver ./cmd/x serve -->\n| flag |") || !strings.HasSuffix(got, "<!-- /flags -->\n\nmore prose\n") {
		t.Errorf("rewrote to:\n%s", got)
	}
	again, err := rewrite(got, func(string, []string) (string, error) { return cobraHelp, nil })
	if err != nil || again != got {
		t.Errorf("a second rewrite changed the doc (%v)", err)
	}
	if _, err := rewrite("<!-- flags: a ./b -->\nno end\n", func(string, []string) (string, error) { return cobraHelp, nil }); err == nil {
		t.Error("an unclosed marker was accepted")
	}
	if _, err := rewrite("<!-- flags: a ./b -->\n<!-- /flags -->\n", func(string, []string) (string, error) { return "no flags here", nil }); err == nil {
		t.Error("a command that prints no flags was accepted")
	}
}
