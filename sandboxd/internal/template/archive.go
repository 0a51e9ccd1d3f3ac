package template

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
)

// Image is what an archive held.
type Image struct {
	// Layers is how many layers were applied.
	Layers int
	// Digest is the digest of the image's config, which names the image.
	Digest string
}

// UnpackArchive unpacks the image in the OCI image archive at archive (an
// OCI image layout as a tarball, or a `docker save` tarball) into dest,
// which must be an empty or missing directory. Layers may be plain or gzip
// tars; their digests are checked. On error dest may hold part of the image:
// the caller removes it.
func UnpackArchive(archive, dest string) (*Image, error) {
	tmp, err := os.MkdirTemp("", "skiff-oci-")
	if err != nil {
		return nil, fmt.Errorf("unpack archive: %w", err)
	}
	defer os.RemoveAll(tmp)
	if err := extractFiles(archive, tmp); err != nil {
		return nil, err
	}
	blobs, err := os.OpenRoot(tmp)
	if err != nil {
		return nil, fmt.Errorf("unpack archive: %w", err)
	}
	defer blobs.Close()
	layers, config, err := readManifest(blobs)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", archive, err)
	}
	if err := os.MkdirAll(dest, 0o755); err != nil {
		return nil, fmt.Errorf("create %s: %w", dest, err)
	}
	root, err := os.OpenRoot(dest)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", dest, err)
	}
	defer root.Close()
	for i, l := range layers {
		if err := applyBlob(blobs, l, root); err != nil {
			return nil, fmt.Errorf("layer %d of %d (%s): %w", i+1, len(layers), l.path, err)
		}
	}
	return &Image{Layers: len(layers), Digest: config}, nil
}

// blob is a layer file inside the extracted archive, with the digest it
// must have ("" when the format does not say).
type blob struct {
	path   string
	digest string
}

// readManifest finds the layers, in order, of the archive's image.
func readManifest(blobs *os.Root) ([]blob, string, error) {
	if data, err := blobs.ReadFile("index.json"); err == nil {
		return readOCI(blobs, data)
	}
	data, err := blobs.ReadFile("manifest.json")
	if err != nil {
		return nil, "", errors.New("neither an OCI layout (index.json) nor a docker save archive (manifest.json)")
	}
	var manifests []struct {
		Config string
		Layers []string
	}
	if err := json.Unmarshal(data, &manifests); err != nil {
		return nil, "", fmt.Errorf("manifest.json: not a docker save manifest: %w", err)
	}
	if len(manifests) == 0 {
		return nil, "", errors.New("manifest.json lists no image")
	}
	var out []blob
	for _, l := range manifests[0].Layers {
		out = append(out, blob{path: l, digest: digestFromPath(l)})
	}
	return out, "sha256:" + strings.TrimSuffix(path.Base(manifests[0].Config), ".json"), nil
}

type descriptor struct {
	MediaType string `json:"mediaType"`
	Digest    string `json:"digest"`
	Platform  *struct {
		OS           string `json:"os"`
		Architecture string `json:"architecture"`
	} `json:"platform,omitempty"`
}

// readOCI follows index.json (and nested indexes) to a linux/amd64 manifest.
func readOCI(blobs *os.Root, index []byte) ([]blob, string, error) {
	for range 4 { // indexes may nest; a few levels is plenty
		var idx struct {
			Manifests []descriptor `json:"manifests"`
			Layers    []descriptor `json:"layers"`
			Config    *descriptor  `json:"config"`
		}
		if err := json.Unmarshal(index, &idx); err != nil {
			return nil, "", fmt.Errorf("decode OCI index or manifest: %w", err)
		}
		if idx.Config != nil { // a manifest
			var out []blob
			for _, l := range idx.Layers {
				p, err := blobPath(l.Digest)
				if err != nil {
					return nil, "", err
				}
				if strings.Contains(l.MediaType, "zstd") {
					return nil, "", fmt.Errorf("layer %s is zstd-compressed, which is not supported: re-export it with gzip", l.Digest)
				}
				out = append(out, blob{path: p, digest: l.Digest})
			}
			return out, idx.Config.Digest, nil
		}
		if len(idx.Manifests) == 0 {
			return nil, "", errors.New("the OCI index lists no manifest")
		}
		pick := idx.Manifests[0]
		for _, m := range idx.Manifests {
			if m.Platform != nil && m.Platform.OS == "linux" && m.Platform.Architecture == "amd64" {
				pick = m
				break
			}
		}
		p, err := blobPath(pick.Digest)
		if err != nil {
			return nil, "", err
		}
		if index, err = blobs.ReadFile(p); err != nil {
			return nil, "", fmt.Errorf("read manifest %s: %w", pick.Digest, err)
		}
	}
	return nil, "", errors.New("OCI indexes nest too deep")
}

func blobPath(digest string) (string, error) {
	alg, hexDigest, ok := strings.Cut(digest, ":")
	if !ok || alg != "sha256" || len(hexDigest) != 64 {
		return "", fmt.Errorf("unsupported digest %q", digest)
	}
	if _, err := hex.DecodeString(hexDigest); err != nil {
		return "", fmt.Errorf("bad digest %q", digest)
	}
	return path.Join("blobs", alg, hexDigest), nil
}

// digestFromPath reads the digest a docker save layer path carries
// (blobs/sha256/<hex>), if any.
func digestFromPath(p string) string {
	if dir, file := path.Split(p); dir == "blobs/sha256/" && len(file) == 64 {
		return "sha256:" + file
	}
	return ""
}

// applyBlob checks a layer's digest while applying it, decompressing gzip.
func applyBlob(blobs *os.Root, b blob, root *os.Root) error {
	f, err := blobs.Open(b.path)
	if err != nil {
		return fmt.Errorf("open: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	br := bufio.NewReader(io.TeeReader(f, h))
	magic, _ := br.Peek(4)
	var r io.Reader = br
	switch {
	case bytes.HasPrefix(magic, []byte{0x1f, 0x8b}):
		gz, err := gzip.NewReader(br)
		if err != nil {
			return fmt.Errorf("gunzip: %w", err)
		}
		defer gz.Close()
		r = gz
	case bytes.Equal(magic, []byte{0x28, 0xb5, 0x2f, 0xfd}):
		return errors.New("zstd-compressed layers are not supported: re-export with gzip")
	}
	if err := applyLayer(root, r); err != nil {
		return err
	}
	if _, err := io.Copy(io.Discard, br); err != nil { // hash what tar left unread
		return fmt.Errorf("read: %w", err)
	}
	if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); b.digest != "" && got != b.digest {
		return fmt.Errorf("digest is %s, want %s", got, b.digest)
	}
	return nil
}

// extractFiles unpacks the outer archive's files (metadata and blobs) into
// dir; anything but regular files and directories is ignored.
func extractFiles(archive, dir string) error {
	f, err := os.Open(archive)
	if err != nil {
		return fmt.Errorf("open archive: %w", err)
	}
	defer f.Close()
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read archive %s: %w", archive, err)
		}
		name, err := cleanName(hdr.Name)
		if err != nil || name == "" {
			if err != nil {
				return fmt.Errorf("archive %s: %w", archive, err)
			}
			continue
		}
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := root.MkdirAll(name, 0o700); err != nil {
				return fmt.Errorf("extract %s: %w", name, err)
			}
		case tar.TypeReg:
			if d := path.Dir(name); d != "." {
				if err := root.MkdirAll(d, 0o700); err != nil {
					return fmt.Errorf("extract %s: %w", name, err)
				}
			}
			out, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
			if err != nil {
				return fmt.Errorf("extract %s: %w", name, err)
			}
			_, err = io.Copy(out, tr)
			if cerr := out.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return fmt.Errorf("extract %s: %w", name, err)
			}
		}
	}
}
