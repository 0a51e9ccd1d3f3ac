// Command flagdocs writes the flag tables of docs/configuration.md from the
// binaries themselves, so that the doc cannot drift from their AddFlags.
//
// The doc marks each table with the command that prints it:
//
//	<!-- flags: MODULE PACKAGE [ARGS...] -->
//	(the table; flagdocs rewrites it)
//	<!-- /flags -->
//
// flagdocs runs `go run PACKAGE ARGS... --help` in the workspace module
// MODULE, reads the flags pflag prints, and writes them as a table: flag,
// default, meaning. The flags under cobra's "Global Flags:" (the root's
// persistent flags, which the subcommand takes too) are read like its own.
// Everything outside the markers is left as it is.
// `make generate` runs it; `make verify` fails when the doc it wrote
// differs from the committed one.
//
// Usage: flagdocs [-check] ROOT DOC (ROOT: the repository, DOC: relative to it).
package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
)

func main() {
	args := os.Args[1:]
	check := len(args) > 0 && args[0] == "-check"
	if check {
		args = args[1:]
	}
	if len(args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: flagdocs [-check] ROOT DOC")
		os.Exit(2)
	}
	if err := run(args[0], args[1], check); err != nil {
		fmt.Fprintln(os.Stderr, "flagdocs:", err)
		os.Exit(1)
	}
}

func run(root, doc string, check bool) error {
	path := filepath.Join(root, doc)
	old, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	updated, err := rewrite(string(old), func(module string, argv []string) (string, error) {
		return help(filepath.Join(root, module), argv)
	})
	if err != nil {
		return fmt.Errorf("%s: %w", doc, err)
	}
	if updated == string(old) {
		return nil
	}
	if check {
		return fmt.Errorf("%s is not what the binaries' flags say: run make generate", doc)
	}
	return os.WriteFile(path, []byte(updated), 0o644)
}

var (
	openMarker = regexp.MustCompile(`^<!-- flags: (\S+) (.+?) -->$`)
	closeLine  = "<!-- /flags -->"
)

// rewrite replaces each marked table of doc with the table of the flags
// helpOf prints for its module and arguments.
func rewrite(doc string, helpOf func(module string, argv []string) (string, error)) (string, error) {
	lines := strings.SplitAfter(doc, "\n")
	var out strings.Builder
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		out.WriteString(line)
		m := openMarker.FindStringSubmatch(strings.TrimRight(line, "\n"))
		if m == nil {
			continue
		}
		end := i + 1
		for end < len(lines) && strings.TrimRight(lines[end], "\n") != closeLine {
			end++
		}
		if end == len(lines) {
			return "", fmt.Errorf("line %d: %q has no %q", i+1, strings.TrimSpace(line), closeLine)
		}
		text, err := helpOf(m[1], strings.Fields(m[2]))
		if err != nil {
			return "", fmt.Errorf("line %d: %w", i+1, err)
		}
		flags := parse(text)
		if len(flags) == 0 {
			return "", fmt.Errorf("line %d: %s %s --help printed no flags", i+1, m[1], m[2])
		}
		out.WriteString(table(flags))
		out.WriteString(lines[end])
		i = end
	}
	return out.String(), nil
}

// help runs `go run PACKAGE ARGS... --help` in dir and returns what it
// printed, stdout and stderr together (pflag's own usage goes to stderr).
func help(dir string, argv []string) (string, error) {
	cmd := exec.Command("go", append(append([]string{"run", argv[0]}, argv[1:]...), "--help")...)
	cmd.Dir = dir
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	// The binaries build in the workspace, whatever the caller's GOWORK.
	env := os.Environ()[:0:0]
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GOWORK=") {
			env = append(env, kv)
		}
	}
	// Defaults that come from the machine must not: a fixed HOME and no
	// XDG_CACHE_HOME, so a default under them reads the same everywhere.
	cmd.Env = append(env, "HOME=/root", "XDG_CACHE_HOME=")
	err := cmd.Run()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		return "", fmt.Errorf("run %s in %s: %w", strings.Join(argv, " "), dir, err)
	}
	if err != nil && !strings.Contains(buf.String(), "--") {
		return "", fmt.Errorf("%s --help in %s: %w: %s", strings.Join(argv, " "), dir, err, buf.String())
	}
	return buf.String(), nil
}

// flag is one flag as pflag prints it.
type flag struct {
	name, short, typ, def, usage string
}

var (
	flagLine   = regexp.MustCompile(`^\s+(?:-([A-Za-z0-9]), )?--([A-Za-z0-9][A-Za-z0-9-]*)(?:\[=[^\]]*\])?(?: ([^ ]+))?\s{2,}(.*)$`)
	defaultEnd = regexp.MustCompile(`^(.*) \(default (.*)\)$`)
)

// parse reads the flags out of pflag's usage text (FlagUsages): one line a
// flag, continuation lines of a long usage indented beneath it, in every
// section ("Flags:", "Global Flags:"). --help is left out.
func parse(text string) []flag {
	var flags []flag
	in := false
	for line := range strings.SplitSeq(text, "\n") {
		if m := flagLine.FindStringSubmatch(line); m != nil {
			in = true
			flags = append(flags, flag{short: m[1], name: m[2], typ: m[3], usage: strings.TrimSpace(m[4])})
			continue
		}
		if in && strings.HasPrefix(line, "        ") && strings.TrimSpace(line) != "" {
			f := &flags[len(flags)-1]
			f.usage += " " + strings.TrimSpace(line)
			continue
		}
		in = false
	}
	kept := flags[:0]
	for _, f := range flags {
		if f.name == "help" {
			continue
		}
		if m := defaultEnd.FindStringSubmatch(f.usage); m != nil {
			f.usage, f.def = m[1], m[2]
		}
		kept = append(kept, f)
	}
	return kept
}

// table writes flags as a Markdown table.
func table(flags []flag) string {
	var b strings.Builder
	b.WriteString("| flag | default | meaning |\n|---|---|---|\n")
	for _, f := range flags {
		name := "`--" + f.name
		if f.typ != "" {
			name += " " + f.typ
		}
		name += "`"
		if f.short != "" {
			name = "`-" + f.short + "`, " + name
		}
		def := ""
		if f.def != "" && f.def != `""` && f.def != "[]" {
			def = "`" + strings.Trim(f.def, `"`) + "`"
		}
		fmt.Fprintf(&b, "| %s | %s | %s |\n", name, def, cell(f.usage))
	}
	return b.String()
}

// cell escapes what Markdown would read as the table's own syntax.
func cell(s string) string {
	return strings.NewReplacer("|", `\|`, "<", "&lt;", ">", "&gt;").Replace(s)
}
