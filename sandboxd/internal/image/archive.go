// Package image writes a container image as a docker-archive tarball (what
// `docker save` writes and `docker load`, `ctr images import`, `kind load
// image-archive`, `skopeo copy docker-archive:` and `crane push` read): a
// manifest.json, the image's config and one uncompressed tar per layer, each
// named by its SHA-256. It needs no registry and no daemon.
package image

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"syscall"
	"time"
)

// Layer is one layer's content: files from the host, by their path in the
// image.
type Layer struct {
	// Comment names the layer in the image's history.
	Comment string
	// Dir, if set, is a directory tree whose content becomes the image's
	// root (modes, owners, times and symlinks kept; device nodes, sockets
	// and FIFOs left out: the runtime makes /dev).
	Dir string
	// Files maps a path in the image (absolute) to a file on the host,
	// written as a regular file with the host file's mode, owned by root.
	Files map[string]string
}

// Config is the image's runtime configuration.
type Config struct {
	Env        []string
	WorkingDir string
	Labels     map[string]string
}

// Write writes the image, tagged ref (repository:tag), to w. Layers are
// staged in tmp (a directory) to learn their digests.
func Write(w io.Writer, ref string, cfg Config, tmp string, layers ...Layer) error {
	if !strings.Contains(ref, ":") {
		return fmt.Errorf("image reference %q has no tag", ref)
	}
	type staged struct{ path, digest string }
	var done []staged
	for i, l := range layers {
		path, digest, err := stage(tmp, i, l)
		if err != nil {
			return fmt.Errorf("layer %d (%s): %w", i, l.Comment, err)
		}
		done = append(done, staged{path, digest})
	}
	diffIDs := make([]string, len(done))
	history := make([]map[string]any, len(layers))
	now := time.Now().UTC().Format(time.RFC3339)
	for i, s := range done {
		diffIDs[i] = "sha256:" + s.digest
		history[i] = map[string]any{"created": now, "created_by": "skiff-image", "comment": layers[i].Comment}
	}
	config, err := json.Marshal(map[string]any{
		"architecture": runtime.GOARCH,
		"os":           "linux",
		"created":      now,
		"config":       map[string]any{"Env": cfg.Env, "WorkingDir": cfg.WorkingDir, "Labels": cfg.Labels},
		"rootfs":       map[string]any{"type": "layers", "diff_ids": diffIDs},
		"history":      history,
	})
	if err != nil {
		return err
	}
	configName := digestOf(config) + ".json"
	layerNames := make([]string, len(done))
	for i, s := range done {
		layerNames[i] = s.digest + "/layer.tar"
	}
	manifest, err := json.Marshal([]map[string]any{{"Config": configName, "RepoTags": []string{ref}, "Layers": layerNames}})
	if err != nil {
		return err
	}
	tw := tar.NewWriter(w)
	if err := writeBytes(tw, configName, config); err != nil {
		return err
	}
	for i, s := range done {
		if err := writeFile(tw, layerNames[i], s.path); err != nil {
			return err
		}
	}
	if err := writeBytes(tw, "manifest.json", manifest); err != nil {
		return err
	}
	return tw.Close()
}

func digestOf(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

func writeBytes(tw *tar.Writer, name string, data []byte) error {
	if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(data)), Typeflag: tar.TypeReg}); err != nil {
		return err
	}
	_, err := tw.Write(data)
	return err
}

func writeFile(tw *tar.Writer, name, path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: st.Size(), Typeflag: tar.TypeReg}); err != nil {
		return err
	}
	_, err = io.Copy(tw, f)
	return err
}

// stage writes layer i's tar into tmp and returns its path and SHA-256.
func stage(tmp string, i int, l Layer) (string, string, error) {
	path := filepath.Join(tmp, fmt.Sprintf("layer-%d.tar", i))
	f, err := os.Create(path)
	if err != nil {
		return "", "", err
	}
	defer f.Close()
	h := sha256.New()
	tw := tar.NewWriter(io.MultiWriter(f, h))
	if l.Dir != "" {
		if err := addDir(tw, l.Dir); err != nil {
			return "", "", err
		}
	}
	if err := addFiles(tw, l.Files); err != nil {
		return "", "", err
	}
	if err := tw.Close(); err != nil {
		return "", "", err
	}
	if err := f.Close(); err != nil {
		return "", "", err
	}
	return path, hex.EncodeToString(h.Sum(nil)), nil
}

// addDir writes dir's tree as the image's root, hard links as links to the
// first path of the same inode.
func addDir(tw *tar.Writer, dir string) error {
	inodes := map[uint64]string{}
	return filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil || rel == "." {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		mode := info.Mode()
		if mode&(fs.ModeDevice|fs.ModeCharDevice|fs.ModeSocket|fs.ModeNamedPipe) != 0 {
			return nil
		}
		link := ""
		if mode&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(path); err != nil {
				return err
			}
		}
		hdr, err := tar.FileInfoHeader(info, link)
		if err != nil {
			return err
		}
		hdr.Name = filepath.ToSlash(rel)
		if info.IsDir() {
			hdr.Name += "/"
		}
		hdr.Uname, hdr.Gname = "", ""
		if st, ok := info.Sys().(*syscall.Stat_t); ok {
			hdr.Uid, hdr.Gid = int(st.Uid), int(st.Gid)
			if mode.IsRegular() && st.Nlink > 1 {
				if first, seen := inodes[st.Ino]; seen {
					hdr.Typeflag, hdr.Linkname, hdr.Size = tar.TypeLink, first, 0
				} else {
					inodes[st.Ino] = hdr.Name
				}
			}
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if hdr.Typeflag != tar.TypeReg {
			return nil
		}
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.Copy(tw, f)
		return err
	})
}

// addFiles writes files (image path → host path), with the directories
// above them, root-owned.
func addFiles(tw *tar.Writer, files map[string]string) error {
	dests := make([]string, 0, len(files))
	for dest := range files {
		if !filepath.IsAbs(dest) {
			return fmt.Errorf("image path %q is not absolute", dest)
		}
		dests = append(dests, dest)
	}
	sort.Strings(dests)
	dirs := map[string]bool{}
	for _, dest := range dests {
		var parents []string
		for d := filepath.Dir(dest); d != "/"; d = filepath.Dir(d) {
			parents = append([]string{d}, parents...)
		}
		for _, d := range parents {
			if dirs[d] {
				continue
			}
			dirs[d] = true
			if err := tw.WriteHeader(&tar.Header{Name: strings.TrimPrefix(d, "/") + "/", Mode: 0o755, Typeflag: tar.TypeDir}); err != nil {
				return err
			}
		}
		src := files[dest]
		st, err := os.Stat(src)
		if err != nil {
			return err
		}
		if !st.Mode().IsRegular() {
			return errors.New(src + " is not a regular file")
		}
		hdr := &tar.Header{Name: strings.TrimPrefix(dest, "/"), Mode: int64(st.Mode().Perm()), Size: st.Size(),
			Typeflag: tar.TypeReg, ModTime: st.ModTime()}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		f, err := os.Open(src)
		if err != nil {
			return err
		}
		_, err = io.Copy(tw, f)
		f.Close()
		if err != nil {
			return err
		}
	}
	return nil
}
