package nodefiles

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// filesEOF ends the here-documents that carry packed files in a boot script.
const filesEOF = "FERRY_FILES_EOF"

// FilesShell is the part of a VM's boot script that syncs f, run before the task's script:
// it exports EnvWorkdir ($HOME/sky_workdir under EnvFilesRoot), unpacks the local files it
// carries (tar.gz, base64 in here-documents) at their remote paths, and fetches every bucket
// object by the URL b made for it now (presigned S3 GETs expire after a week; GCS media URLs
// are authorised with the VM's metadata token). The VM needs bash, base64, tar and curl. A step
// that fails calls the shell function ferry_files_fail with what failed, which the caller
// defines (vmnode.Boot).
// limit bounds the packed local files, after compression and base64, which the cloud's
// user-data or metadata value must hold; beyond it the error says to use a bucket.
func FilesShell(ctx context.Context, infra string, f Files, b Buckets, limit int) (string, error) {
	if f.Empty() {
		return "", nil
	}
	var sh strings.Builder
	sh.WriteString("# files: workdir and file_mounts\n")
	sh.WriteString("ferry_files=\"${" + EnvFilesRoot + ":-${FERRY_VM_ROOT:-}}\"\nferry_home=\"${HOME:-/root}\"\n")
	sh.WriteString("export " + EnvFilesRoot + "=\"$ferry_files\"\n")
	packed := 0
	add := func(dir, src, name string) error {
		payload, err := packTarGz(src, name)
		if err != nil {
			return err
		}
		packed += len(payload)
		if packed > limit {
			return fmt.Errorf("%w: %s: the workdir and local file_mounts pack to over %d KiB, more than the boot script can carry; put them in a bucket (s3:// or gs://) and mount that instead", ErrFiles, infra, limit/1024)
		}
		sh.WriteString("mkdir -p " + dir + "\nbase64 -d <<'" + filesEOF + "' | tar -xzf - -C " + dir + " || ferry_files_fail " + ShellQuote("unpack "+src) + "\n" + payload + filesEOF + "\n")
		return nil
	}
	if f.Workdir != "" {
		sh.WriteString("export " + EnvWorkdir + "=\"$ferry_files$ferry_home/" + WorkdirName + "\"\n")
		if err := add(`"$`+EnvWorkdir+`"`, f.Workdir, ""); err != nil {
			return "", err
		}
	}
	fetches := false
	for _, m := range f.Mounts {
		rel, inHome, err := RemotePath(m.Dst)
		if err != nil {
			return "", err
		}
		base := `"$ferry_files"/`
		if inHome {
			base = `"$ferry_files$ferry_home"/`
		}
		if m.Mounted() {
			continue // mountsShell
		}
		if m.Bucket != nil {
			if !fetches {
				sh.WriteString(fetchFunc)
				fetches = true
			}
			if err := fetchLines(ctx, &sh, b, m, base+ShellQuote(rel)); err != nil {
				return "", err
			}
			continue
		}
		info, err := os.Stat(m.Src)
		if err != nil {
			return "", fmt.Errorf("%w: file_mounts.%s: local path %s: %v", ErrFiles, m.Dst, m.Src, err)
		}
		if info.IsDir() {
			err = add(base+ShellQuote(rel), m.Src, "")
		} else {
			err = add(base+ShellQuote(path.Dir(rel)), m.Src, path.Base(rel))
		}
		if err != nil {
			return "", err
		}
	}
	mounts, err := mountsShell(f)
	if err != nil {
		return "", err
	}
	sh.WriteString(mounts)
	return sh.String(), nil
}

// fetchFunc defines ferry_fetch URL DEST GCS: a download, retried, with the VM's GCS token
// when GCS is 1 (read once from the metadata server).
const fetchFunc = `ferry_fetch() {
  mkdir -p "$(dirname "$2")"
  if [ "$3" = 1 ]; then
    if [ -z "${ferry_gcs_token:-}" ]; then
      ferry_gcs_token=$(curl -sf --max-time 10 -H 'Metadata-Flavor: Google' "${FERRY_GCE_METADATA_URL:-http://metadata.google.internal}/computeMetadata/v1/instance/service-accounts/default/token" | sed -n 's/.*"access_token" *: *"\([^"]*\)".*/\1/p')
      [ -n "$ferry_gcs_token" ] || { echo "ferry: no service-account token from the metadata server: the VM cannot read gs:// mounts" >&2; return 1; }
    fi
    curl -fsSL --retry 3 -H "Authorization: Bearer $ferry_gcs_token" -o "$2" "$1"
  else
    curl -fsSL --retry 3 -o "$2" "$1"
  fi || { echo "ferry: download of $2 failed" >&2; return 1; }
}
`

// fetchLines writes one ferry_fetch per object under m's bucket URL.
func fetchLines(ctx context.Context, sh *strings.Builder, b Buckets, m FileMount, dst string) error {
	if b == nil {
		return fmt.Errorf("%w: file_mounts.%s: no bucket client configured for %s", ErrFiles, m.Dst, m.Src)
	}
	objs, err := b.List(ctx, *m.Bucket)
	if err != nil {
		return fmt.Errorf("file_mounts.%s: %w", m.Dst, err)
	}
	sh.WriteString("echo " + ShellQuote(fmt.Sprintf("ferry: fetching %d objects of %s", len(objs), m.Src)) + "\n")
	for _, o := range objs {
		rel := objectPath(*m.Bucket, o.Key)
		if rel != "" && !filepath.IsLocal(rel) {
			return fmt.Errorf("%w: file_mounts.%s: object %q leaves its mount", ErrFiles, m.Dst, o.Key)
		}
		d, err := b.DownloadURL(ctx, *m.Bucket, o.Key)
		if err != nil {
			return fmt.Errorf("file_mounts.%s: %w", m.Dst, err)
		}
		target := dst
		if rel != "" {
			target += "/" + ShellQuote(rel)
		}
		auth := "0"
		if d.NeedsGCSAuth {
			auth = "1"
		}
		sh.WriteString("ferry_fetch " + ShellQuote(d.URL) + " " + target + " " + auth + " || ferry_files_fail " + ShellQuote("fetch "+m.Src) + "\n")
	}
	return nil
}

// packTarGz packs src (a directory's contents, or one file named name) as tar.gz, base64 in
// lines of 76.
func packTarGz(src, name string) (string, error) {
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	if err := writeTar(tw, src, name, ""); err != nil {
		return "", err
	}
	if err := errors.Join(tw.Close(), gz.Close()); err != nil {
		return "", err
	}
	enc := base64.StdEncoding.EncodeToString(buf.Bytes())
	var out strings.Builder
	for len(enc) > 76 {
		out.WriteString(enc[:76] + "\n")
		enc = enc[76:]
	}
	out.WriteString(enc + "\n")
	return out.String(), nil
}

// writeTar adds src to tw under prefix: a file as name, a directory's tree relative to it.
func writeTar(tw *tar.Writer, src, name, prefix string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("%w: local path %s does not exist", ErrFiles, p)
			}
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		if !d.IsDir() && rel == "." {
			rel = name
		}
		if rel == "." {
			return nil
		}
		link := ""
		if d.Type()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		} else if !d.IsDir() && !d.Type().IsRegular() {
			return nil
		}
		hdr, err := tar.FileInfoHeader(info, link)
		if err != nil {
			return err
		}
		hdr.Name = prefix + filepath.ToSlash(rel)
		hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname = 0, 0, "", ""
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if !d.Type().IsRegular() {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.Copy(tw, f)
		return err
	})
}

// PackLocal packs f's local files into one tar.gz for an instance that unpacks them in one
// place (a pod's init container): the workdir under "workdir/", the i-th mount (in f.Mounts'
// order) under "mounts/<i>/", a single file as "mounts/<i>/<its remote name>". Bucket mounts
// are not packed. limit bounds the packed size.
func PackLocal(f Files, limit int, what string) ([]byte, error) {
	tooBig := fmt.Errorf("%w: the workdir and local file_mounts pack to over %d KiB, more than %s can carry; put them in a bucket (s3://) and mount that instead", ErrFiles, limit/1024, what)
	var buf bytes.Buffer
	// Packing stops at the limit, so a large workdir is never held in memory whole.
	gz := gzip.NewWriter(&capWriter{w: &buf, left: limit, err: tooBig})
	tw := tar.NewWriter(gz)
	if f.Workdir != "" {
		if err := tarDir(tw, "workdir/"); err != nil {
			return nil, err
		}
		if err := writeTar(tw, f.Workdir, "", "workdir/"); err != nil {
			return nil, err
		}
	}
	for i, m := range f.Mounts {
		if m.Bucket != nil {
			continue
		}
		info, err := os.Stat(m.Src)
		if err != nil {
			return nil, fmt.Errorf("%w: file_mounts.%s: local path %s: %v", ErrFiles, m.Dst, m.Src, err)
		}
		name := ""
		if !info.IsDir() {
			name = path.Base(m.Dst)
		}
		prefix := fmt.Sprintf("mounts/%d/", i)
		if err := tarDir(tw, prefix); err != nil {
			return nil, err
		}
		if err := writeTar(tw, m.Src, name, prefix); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	if err := gz.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// capWriter fails with err once more than left bytes were written.
type capWriter struct {
	w    io.Writer
	left int
	err  error
}

func (c *capWriter) Write(p []byte) (int, error) {
	if len(p) > c.left {
		return 0, c.err
	}
	c.left -= len(p)
	return c.w.Write(p)
}

// tarDir adds an empty directory entry, so that an empty source still unpacks to a directory.
func tarDir(tw *tar.Writer, name string) error {
	return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: 0o755})
}
