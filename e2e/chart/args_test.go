package chart

import (
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

var flagName = regexp.MustCompile(`--[a-z0-9][a-z0-9-]*`)

// TestArgsAreFlags: every flag the chart passes, in every value set, to
// every container and init container, is one the binary's command has (its
// --help lists it), so that no pod crash-loops on a misspelt flag.
func TestArgsAreFlags(t *testing.T) {
	helps := map[string]map[string]bool{}
	known := func(command []string) map[string]bool {
		key := strings.Join(command, " ")
		if f, ok := helps[key]; ok {
			return f
		}
		bin := binary(t, filepath.Base(command[0]))
		out, err := exec.CommandContext(t.Context(), bin, append(command[1:], "--help")...).CombinedOutput()
		if err != nil {
			t.Fatalf("%s --help: %v\n%s", key, err, out)
		}
		f := map[string]bool{}
		for _, name := range flagName.FindAllString(string(out), -1) {
			f[name] = true
		}
		helps[key] = f
		return f
	}
	checked := 0
	for _, set := range valueSets {
		for _, obj := range objects(t, render(t, set)) {
			if obj.GetKind() != "Deployment" && obj.GetKind() != "DaemonSet" {
				continue
			}
			for _, field := range []string{"containers", "initContainers"} {
				cs, _, _ := unstructured.NestedSlice(obj.Object, "spec", "template", "spec", field)
				for _, c := range cs {
					m := c.(map[string]any)
					command, _, _ := unstructured.NestedStringSlice(m, "command")
					args, _, _ := unstructured.NestedStringSlice(m, "args")
					// The subcommand: the arguments before the first flag.
					i := 0
					for i < len(args) && !strings.HasPrefix(args[i], "-") {
						i++
					}
					flags := known(append(command, subcommand(args[:i])...))
					for _, a := range args[i:] {
						name, _, _ := strings.Cut(a, "=")
						if !strings.HasPrefix(name, "--") {
							t.Errorf("%s: %s %s/%s: argument %q is not --flag=value", set, obj.GetKind(), obj.GetName(), m["name"], a)
							continue
						}
						checked++
						if !flags[name] {
							t.Errorf("%s: %s %s container %s passes %s, which %s does not have", set, obj.GetKind(), obj.GetName(), m["name"], name, strings.Join(command, " "))
						}
					}
				}
			}
		}
	}
	if checked == 0 {
		t.Fatal("no flags checked")
	}
	t.Logf("%d flags checked against %d commands' --help", checked, len(helps))
}

// subcommand drops a subcommand's positional arguments (template build
// base: base), which --help does not take.
func subcommand(words []string) []string {
	if len(words) == 3 && words[0] == "template" && words[1] == "build" {
		return words[:2]
	}
	return words
}
