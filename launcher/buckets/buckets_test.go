package buckets_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/url"
	"testing"

	"github.com/aws/aws-sdk-go-v2/credentials"
	"golang.org/x/oauth2"
	"google.golang.org/api/option"

	"github.com/ferryserve/ferry/launcher/buckets"
	"github.com/ferryserve/ferry/launcher/buckets/fakegcs"
	"github.com/ferryserve/ferry/launcher/buckets/fakes3"
	"github.com/ferryserve/ferry/launcher/nodefiles"
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
			dir := nodefiles.BucketURL{Scheme: scheme, Bucket: "data", Prefix: "models"}
			objs, err := c.List(ctx, dir)
			if err != nil {
				t.Fatal(err)
			}
			want := []nodefiles.BucketObject{{Key: "models/a.txt", Size: 5}, {Key: "models/sub/b.txt", Size: 5}}
			if len(objs) != 2 || objs[0].Key != want[0].Key || objs[1].Key != want[1].Key || objs[0].Size != 5 || objs[0].ETag == "" {
				t.Fatalf("List(%s) = %v, want %v with ETags", dir, objs, want)
			}
			one, err := c.List(ctx, nodefiles.BucketURL{Scheme: scheme, Bucket: "data", Prefix: "one.bin"})
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
			_, err = c.List(ctx, nodefiles.BucketURL{Scheme: scheme, Bucket: "missing", Prefix: "x"})
			if !errors.Is(err, nodefiles.ErrFiles) {
				t.Errorf("List(missing bucket) = %v, want ErrFiles", err)
			}
			_, err = c.List(ctx, nodefiles.BucketURL{Scheme: scheme, Bucket: "data", Prefix: "nothing/"})
			if !errors.Is(err, nodefiles.ErrFiles) {
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
	d, err := c.DownloadURL(context.Background(), nodefiles.BucketURL{Scheme: "s3", Bucket: "data"}, "one.bin")
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

// TestPutDeleteListMount: a mounted bucket's sync writes through Put and Delete, with the
// client's credentials, and lists an empty prefix as nothing, not an error; a Put's ETag is
// the one a listing shows for the same content.
func TestPutDeleteListMount(t *testing.T) {
	s3, gcs, c := newFakes(t)
	ctx := context.Background()
	for _, scheme := range []string{"s3", "gs"} {
		t.Run(scheme, func(t *testing.T) {
			dir := nodefiles.BucketURL{Scheme: scheme, Bucket: "data", Prefix: "ckpt/"}
			objs, err := c.ListMount(ctx, dir)
			if err != nil || len(objs) != 0 {
				t.Fatalf("ListMount(empty prefix) = %v, %v; want nothing, no error", objs, err)
			}
			body := []byte(`{"step": 20}`)
			tag, err := c.Put(ctx, dir, "ckpt/run/checkpoint.json", bytes.NewReader(body), int64(len(body)))
			if err != nil {
				t.Fatal(err)
			}
			objs, err = c.ListMount(ctx, dir)
			if err != nil || len(objs) != 1 || objs[0].Key != "ckpt/run/checkpoint.json" || objs[0].ETag != tag || tag == "" {
				t.Fatalf("ListMount after Put = %v, %v; want the object with ETag %q", objs, err, tag)
			}
			r, err := c.Open(ctx, dir, "ckpt/run/checkpoint.json")
			if err != nil {
				t.Fatal(err)
			}
			got, _ := io.ReadAll(r)
			r.Close()
			if string(got) != string(body) {
				t.Errorf("read back %q, want %q", got, body)
			}
			if err := c.Delete(ctx, dir, "ckpt/run/checkpoint.json"); err != nil {
				t.Fatal(err)
			}
			if err := c.Delete(ctx, dir, "ckpt/run/checkpoint.json"); err != nil {
				t.Errorf("deleting a deleted object: %v, want no error", err)
			}
			if objs, err := c.ListMount(ctx, dir); err != nil || len(objs) != 0 {
				t.Errorf("ListMount after Delete = %v, %v", objs, err)
			}
			if _, err := c.ListMount(ctx, nodefiles.BucketURL{Scheme: scheme, Bucket: "missing"}); !errors.Is(err, nodefiles.ErrFiles) {
				t.Errorf("ListMount(missing bucket) = %v, want ErrFiles", err)
			}
		})
	}
	if w := s3.Writes(); len(w) != 3 || w[0].Method != http.MethodPut || w[0].AccessKey != "AKID" {
		t.Errorf("S3 writes %+v, want a PUT and two DELETEs signed by AKID", w)
	}
	if w := gcs.Writes(); len(w) != 2 || w[0].Token != "tok" {
		t.Errorf("GCS writes %+v, want an insert and a delete with the client's token", w)
	}
}

// TestGCSReadTokenNarrows: the token lent to a VM without Google credentials is the
// controller's narrowed by a Credential Access Boundary: it reads objects under the copied
// prefix and nothing else, and writes nothing; without credentials to lend, none is made.
func TestGCSReadTokenNarrows(t *testing.T) {
	_, gcs, _ := newFakes(t)
	gcsURL, _ := url.Parse(gcs.URL())
	sts := &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if r.URL.Host != "sts.googleapis.com" {
			return nil, errors.New("token exchange sent to " + r.URL.Host)
		}
		r = r.Clone(r.Context())
		r.URL.Scheme, r.URL.Host, r.Host = gcsURL.Scheme, gcsURL.Host, gcsURL.Host
		return http.DefaultTransport.RoundTrip(r)
	})}
	c := buckets.New(buckets.Options{GCSEndpoint: gcs.URL(), STSClient: sts,
		GCSTokenSource: oauth2.StaticTokenSource(&oauth2.Token{AccessToken: "tok"})})
	ctx := context.Background()
	tok, err := c.GCSReadToken(ctx, []nodefiles.BucketURL{{Scheme: "gs", Bucket: "data", Prefix: "models"}})
	if err != nil {
		t.Fatal(err)
	}
	if tok == "tok" || tok == "" {
		t.Fatalf("lent token %q, want a narrowed one", tok)
	}
	get := func(method, path string) int {
		req, _ := http.NewRequest(method, gcs.URL()+path, nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for path, want := range map[string]int{
		"/storage/v1/b/data/o/models%2Fa.txt?alt=media": http.StatusOK,
		"/storage/v1/b/data/o/one.bin?alt=media":        http.StatusForbidden,
	} {
		if got := get(http.MethodGet, path); got != want {
			t.Errorf("GET %s with the lent token = %d, want %d", path, got, want)
		}
	}
	if got := get(http.MethodDelete, "/storage/v1/b/data/o/models%2Fa.txt"); got != http.StatusForbidden {
		t.Errorf("DELETE with the lent token = %d, want 403", got)
	}
	noCreds := buckets.New(buckets.Options{GCSEndpoint: gcs.URL()})
	if _, err := noCreds.GCSReadToken(ctx, []nodefiles.BucketURL{{Scheme: "gs", Bucket: "data"}}); err == nil {
		t.Error("a client with no credentials to lend made a token")
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestCheckBucketWhateverItHolds: the check before a mount reads one object at most, so a
// bucket holding more than a copy may list is mounted; a missing bucket is ErrFiles.
func TestCheckBucketWhateverItHolds(t *testing.T) {
	s3, gcs, _ := newFakes(t)
	c := buckets.New(buckets.Options{
		S3Endpoint:  s3.URL(),
		Credentials: credentials.NewStaticCredentialsProvider("AKID", "SECRET", ""),
		GCSEndpoint: gcs.URL(),
		GCSOptions:  []option.ClientOption{option.WithTokenSource(oauth2.StaticTokenSource(&oauth2.Token{AccessToken: "tok"}))},
		MaxObjects:  1,
	})
	ctx := context.Background()
	for _, scheme := range []string{"s3", "gs"} {
		t.Run(scheme, func(t *testing.T) {
			models := nodefiles.BucketURL{Scheme: scheme, Bucket: "data", Prefix: "models/"}
			if _, err := c.ListMount(ctx, models); err == nil {
				t.Fatal("ListMount of two objects with MaxObjects 1: no error; the test would prove nothing")
			}
			if err := c.CheckBucket(ctx, models); err != nil {
				t.Errorf("CheckBucket(two objects) = %v, want nil", err)
			}
			if err := c.CheckBucket(ctx, nodefiles.BucketURL{Scheme: scheme, Bucket: "data", Prefix: "empty/"}); err != nil {
				t.Errorf("CheckBucket(empty prefix) = %v, want nil", err)
			}
			if err := c.CheckBucket(ctx, nodefiles.BucketURL{Scheme: scheme, Bucket: "missing"}); !errors.Is(err, nodefiles.ErrFiles) {
				t.Errorf("CheckBucket(missing bucket) = %v, want ErrFiles", err)
			}
		})
	}
}
