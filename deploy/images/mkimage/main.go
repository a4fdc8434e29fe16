// Command mkimage writes an OCI image layout from root filesystem trees, without a container engine and
// reproducibly: every layer is a tar of one tree with its entries in byte order, owned by root (or by the
// owners given with -owner), dated SOURCE_DATE_EPOCH, with no user or group names and no access times; the
// image's created time and history are that date too. Same trees and flags, same digest.
//
//	mkimage -out DIR -tag NAME -layer base=ROOTFS1 -layer app=ROOTFS2 -entrypoint /usr/bin/ibvbridge \
//	  -user 65532:65532 -env PATH=/usr/bin:/bin -label org.opencontainers.image.title=... -owner /run/ibvbridge=65532:65532
//
// It prints the image's manifest digest.
package main

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

type multi []string

func (m *multi) String() string     { return strings.Join(*m, ",") }
func (m *multi) Set(s string) error { *m = append(*m, s); return nil }

type owner struct{ uid, gid int }

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("mkimage", flag.ContinueOnError)
	out := fs.String("out", "", "OCI image layout directory to write (replaced)")
	tag := fs.String("tag", "", "the image's name in the layout (org.opencontainers.image.ref.name)")
	entry := fs.String("entrypoint", "", "entrypoint, words separated by spaces")
	cmd := fs.String("cmd", "", "default arguments, words separated by spaces")
	user := fs.String("user", "65532:65532", "UID:GID the container runs as")
	workdir := fs.String("workdir", "/", "working directory")
	var layers, envs, labels, owners multi
	fs.Var(&layers, "layer", "NAME=DIR: a layer holding the tree DIR (repeat, bottom first)")
	fs.Var(&envs, "env", "KEY=VALUE in the image's environment (repeat)")
	fs.Var(&labels, "label", "KEY=VALUE label (repeat)")
	fs.Var(&owners, "owner", "PATH=UID:GID: owner of that path in the image (default root) (repeat)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *out == "" || *tag == "" || len(layers) == 0 {
		return errors.New("need -out, -tag and at least one -layer")
	}
	epoch, err := strconv.ParseInt(os.Getenv("SOURCE_DATE_EPOCH"), 10, 64)
	if err != nil {
		return fmt.Errorf("SOURCE_DATE_EPOCH must be set to a Unix time: %w", err)
	}
	when := time.Unix(epoch, 0).UTC()
	own := map[string]owner{}
	for _, o := range owners {
		p, ids, ok := strings.Cut(o, "=")
		u, g, ok2 := strings.Cut(ids, ":")
		uid, err1 := strconv.Atoi(u)
		gid, err2 := strconv.Atoi(g)
		if !ok || !ok2 || err1 != nil || err2 != nil {
			return fmt.Errorf("-owner %q: want PATH=UID:GID", o)
		}
		own[strings.Trim(p, "/")] = owner{uid, gid}
	}

	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	for _, l := range layers {
		name, dir, ok := strings.Cut(l, "=")
		if !ok {
			return fmt.Errorf("-layer %q: want NAME=DIR", l)
		}
		b, err := tarTree(dir, when, own)
		if err != nil {
			return err
		}
		layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil },
			tarball.WithMediaType(types.OCILayer))
		if err != nil {
			return fmt.Errorf("layer %s: %w", name, err)
		}
		img, err = mutate.Append(img, mutate.Addendum{Layer: layer, History: v1.History{
			Created: v1.Time{Time: when}, CreatedBy: "mkimage layer " + name, Comment: name}})
		if err != nil {
			return fmt.Errorf("layer %s: %w", name, err)
		}
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS = runtime.GOARCH, "linux"
	cf.Created = v1.Time{Time: when}
	cf.Config.Entrypoint = strings.Fields(*entry)
	cf.Config.Cmd = strings.Fields(*cmd)
	cf.Config.User = *user
	cf.Config.WorkingDir = *workdir
	cf.Config.Env = envs
	if len(labels) > 0 {
		cf.Config.Labels = map[string]string{}
		for _, l := range labels {
			k, v, _ := strings.Cut(l, "=")
			cf.Config.Labels[k] = v
		}
	}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return err
	}
	if err := os.RemoveAll(*out); err != nil {
		return err
	}
	p, err := layout.Write(*out, empty.Index)
	if err != nil {
		return fmt.Errorf("write %s: %w", *out, err)
	}
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": *tag})); err != nil {
		return fmt.Errorf("write %s: %w", *out, err)
	}
	d, err := img.Digest()
	if err != nil {
		return err
	}
	m, _ := img.Manifest()
	sum := struct {
		Tag    string   `json:"tag"`
		Digest string   `json:"digest"`
		Layers []string `json:"layers"`
	}{Tag: *tag, Digest: d.String()}
	for _, l := range m.Layers {
		sum.Layers = append(sum.Layers, l.Digest.String())
	}
	return json.NewEncoder(os.Stdout).Encode(sum)
}

// tarTree is the tree at dir as a tar stream: entries in byte order of their paths, directories before
// what they hold, regular files, directories, symlinks and hard links (a second name of an inode already
// written) only, owned by root unless own names the path, dated when, permission bits as on disk.
func tarTree(dir string, when time.Time, own map[string]owner) ([]byte, error) {
	var paths []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if rel, _ := filepath.Rel(dir, p); rel != "." {
			paths = append(paths, rel)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("walk %s: %w", dir, err)
	}
	sort.Strings(paths)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	seen := map[[2]uint64]string{}
	for _, rel := range paths {
		full := filepath.Join(dir, rel)
		fi, err := os.Lstat(full)
		if err != nil {
			return nil, err
		}
		h := &tar.Header{Name: rel, ModTime: when, Mode: int64(fi.Mode().Perm()), Format: tar.FormatPAX}
		if fi.Mode()&fs.ModeSetuid != 0 {
			h.Mode |= 0o4000
		}
		if fi.Mode()&fs.ModeSetgid != 0 {
			h.Mode |= 0o2000
		}
		if fi.Mode()&fs.ModeSticky != 0 {
			h.Mode |= 0o1000
		}
		if o, ok := own[rel]; ok {
			h.Uid, h.Gid = o.uid, o.gid
		}
		var body []byte
		switch {
		case fi.IsDir():
			h.Typeflag, h.Name = tar.TypeDir, rel+"/"
		case fi.Mode()&fs.ModeSymlink != 0:
			h.Typeflag = tar.TypeSymlink
			if h.Linkname, err = os.Readlink(full); err != nil {
				return nil, err
			}
		case fi.Mode().IsRegular():
			st, _ := fi.Sys().(*syscall.Stat_t)
			if st != nil && st.Nlink > 1 {
				key := [2]uint64{st.Dev, st.Ino}
				if first, ok := seen[key]; ok {
					h.Typeflag, h.Linkname = tar.TypeLink, first
					break
				}
				seen[key] = rel
			}
			h.Typeflag = tar.TypeReg
			if body, err = os.ReadFile(full); err != nil {
				return nil, err
			}
			h.Size = int64(len(body))
		default:
			return nil, fmt.Errorf("%s: %v is neither file, directory nor symlink", full, fi.Mode().Type())
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("%s: %w", rel, err)
		}
		if _, err := tw.Write(body); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
