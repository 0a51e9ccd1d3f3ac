package image

import (
	"debug/elf"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// libDirs are where a Debian root filesystem keeps shared libraries.
var libDirs = []string{"lib", "usr/lib", "lib64", "lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu",
	"lib/aarch64-linux-gnu", "usr/lib/aarch64-linux-gnu"}

// CheckLinked says whether the ELF binary bin would load in the root
// filesystem root: a static binary always does; a dynamic one needs its
// interpreter and every library it names (DT_NEEDED) there.
func CheckLinked(root, bin string) error {
	f, err := elf.Open(bin)
	if err != nil {
		return fmt.Errorf("%s: %w", bin, err)
	}
	defer f.Close()
	var interp string
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			b := make([]byte, p.Filesz)
			if _, err := p.ReadAt(b, 0); err != nil {
				return fmt.Errorf("%s: read its interpreter: %w", bin, err)
			}
			interp = strings.TrimRight(string(b), "\x00")
		}
	}
	if interp == "" {
		return nil
	}
	if _, err := os.Stat(filepath.Join(root, interp)); err != nil {
		return fmt.Errorf("%s needs the loader %s, which the image lacks", filepath.Base(bin), interp)
	}
	libs, err := f.ImportedLibraries()
	if err != nil {
		return fmt.Errorf("%s: %w", bin, err)
	}
	var missing []string
	for _, lib := range libs {
		found := false
		for _, dir := range libDirs {
			if _, err := os.Stat(filepath.Join(root, dir, lib)); err == nil {
				found = true
				break
			}
		}
		if !found {
			missing = append(missing, lib)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%s needs %s, which the image lacks", filepath.Base(bin), strings.Join(missing, ", "))
	}
	return nil
}
