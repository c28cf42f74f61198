package buckets_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/url"
	"testing"

	"github.com/aws/aws-sdk-go-v2/credentials"
	"golang.org/x/oauth2"
	"google.golang.org/api/option"

	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/buckets"
	"github.com/ferryserve/ferry/launcher/buckets/fakegcs"
	"github.com/ferryserve/ferry/launcher/buckets/fakes3"
)

// NewFakes starts a fake S3 and a fake GCS (which wants token) with the same objects, and a
// Client pointed at both.
func newFakes(t *testing.T) (*fakes3.Server, *fakegcs.Server, *buckets.Client) {
	t.Helper()
	s3 := fakes3.New()
	t.Cleanup(s3.Close)
	gcs := fakegcs.New(fakegcs.Options{Token: "tok"})
	t.Cleanup(gcs.Close)
	for _, put := range []func(string, string, []byte){s3.Put, gcs.Put} {
		put("data", "models/a.txt", []byte("alpha"))
		put("data", "models/sub/b.txt", []byte("bravo"))
		put("data", "modelsX/c.txt", []byte("not under models/"))
		put("data", "one.bin", []byte("single"))
	}
	c := buckets.New(buckets.Options{
		S3Endpoint:  s3.URL(),
		Credentials: credentials.NewStaticCredentialsProvider("AKID", "SECRET", ""),
		GCSEndpoint: gcs.URL(),
		GCSOptions:  []option.ClientOption{option.WithTokenSource(oauth2.StaticTokenSource(&oauth2.Token{AccessToken: "tok"}))},
	})
	return s3, gcs, c
}

func TestListOpenAndDownloadURLs(t *testing.T) {
	s3, gcs, c := newFakes(t)
	ctx := context.Background()
	for _, scheme := range []string{"s3", "gs"} {
		t.Run(scheme, func(t *testing.T) {
			dir := launcher.BucketURL{Scheme: scheme, Bucket: "data", Prefix: "models"}
			objs, err := c.List(ctx, dir)
			if err != nil {
				t.Fatal(err)
			}
			want := []launcher.BucketObject{{Key: "models/a.txt", Size: 5}, {Key: "models/sub/b.txt", Size: 5}}
			if len(objs) != 2 || objs[0] != want[0] || objs[1] != want[1] {
				t.Fatalf("List(%s) = %v, want %v", dir, objs, want)
			}
			one, err := c.List(ctx, launcher.BucketURL{Scheme: scheme, Bucket: "data", Prefix: "one.bin"})
			if err != nil || len(one) != 1 || one[0].Key != "one.bin" {
				t.Fatalf("List(one object) = %v, %v", one, err)
			}
			r, err := c.Open(ctx, dir, "models/sub/b.txt")
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(r)
			r.Close()
			if string(body) != "bravo" {
				t.Errorf("Open = %q, want bravo", body)
			}
			d, err := c.DownloadURL(ctx, dir, "models/a.txt")
			if err != nil {
				t.Fatal(err)
			}
			if d.NeedsGCSAuth != (scheme == "gs") {
				t.Errorf("NeedsGCSAuth = %v for %s", d.NeedsGCSAuth, scheme)
			}
			req, _ := http.NewRequest(http.MethodGet, d.URL, nil)
			if d.NeedsGCSAuth {
				req.Header.Set("Authorization", "Bearer tok")
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ = io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || string(body) != "alpha" {
				t.Errorf("GET %s = %d %q, want 200 alpha", d.URL, resp.StatusCode, body)
			}
			_, err = c.List(ctx, launcher.BucketURL{Scheme: scheme, Bucket: "missing", Prefix: "x"})
			if !errors.Is(err, launcher.ErrFiles) {
				t.Errorf("List(missing bucket) = %v, want ErrFiles", err)
			}
			_, err = c.List(ctx, launcher.BucketURL{Scheme: scheme, Bucket: "data", Prefix: "nothing/"})
			if !errors.Is(err, launcher.ErrFiles) {
				t.Errorf("List(empty prefix) = %v, want ErrFiles", err)
			}
		})
	}
	if s3.Presigned() != 1 || gcs.Downloads() < 1 {
		t.Errorf("presigned GETs = %d, GCS downloads = %d; want 1 and at least 1", s3.Presigned(), gcs.Downloads())
	}
}

func TestFakeS3RefusesUnsignedAndExpired(t *testing.T) {
	s3, _, c := newFakes(t)
	resp, err := http.Get(s3.URL() + "/data/one.bin")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("unsigned GET = %d, want 403", resp.StatusCode)
	}
	d, err := c.DownloadURL(context.Background(), launcher.BucketURL{Scheme: "s3", Bucket: "data"}, "one.bin")
	if err != nil {
		t.Fatal(err)
	}
	expired := replaceQuery(t, d.URL, "X-Amz-Date", "20200101T000000Z")
	resp, err = http.Get(expired)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("expired presigned GET = %d, want 403", resp.StatusCode)
	}
}

func replaceQuery(t *testing.T, raw, key, value string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set(key, value)
	u.RawQuery = q.Encode()
	return u.String()
}
