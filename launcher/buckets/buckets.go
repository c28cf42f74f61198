// Package buckets reads the s3:// and gs:// sources of file_mounts through the AWS and Google
// SDKs: listing, reading (local instances) and download URLs for instances without
// credentials of their own (presigned S3 GETs; GCS media URLs the VM authorises with its
// metadata token); and writes the objects of a mounted bucket that is kept in sync from a
// directory (launcher/buckets/bucketsync).
package buckets

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	s3types "github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go"
	"golang.org/x/oauth2"
	"google.golang.org/api/googleapi"
	"google.golang.org/api/option"
	storage "google.golang.org/api/storage/v1"

	"github.com/ferryserve/ferry/launcher/nodefiles"
)

// Options point the clients at endpoints other than AWS's and Google's (the fakes, a
// compatible store) and bound what one mount may hold.
type Options struct {
	// S3Endpoint, when set, is used with path-style addressing (e.g. "http://127.0.0.1:PORT").
	// Empty is AWS_ENDPOINT_URL_S3 when set (path-style too, as S3-compatible stores and the
	// fake want), else AWS's own endpoints.
	S3Endpoint string
	// S3Region is the signing region when the bucket's own cannot be learnt; default
	// AWS_REGION, else us-east-1.
	S3Region string
	// Credentials overrides the SDK's default credential chain for S3.
	Credentials awssdk.CredentialsProvider
	// GCSEndpoint is the JSON API's root ("http://127.0.0.1:PORT"); empty is
	// STORAGE_EMULATOR_HOST when set, else https://storage.googleapis.com.
	GCSEndpoint string
	// GCSOptions are added to the GCS client (credentials); with a GCSEndpoint and none, the
	// client sends no credentials.
	GCSOptions []option.ClientOption
	// GCSTokenSource is the controller's Google credentials for the read tokens it lends VMs
	// without a service account (GCSReadToken); default Application Default Credentials,
	// except with a GCSEndpoint, where none is lent.
	GCSTokenSource oauth2.TokenSource
	// STSClient makes the token exchange that narrows a lent token (Google's Security Token
	// Service, sts.googleapis.com); default http.DefaultClient. Tests route it to a fake.
	STSClient *http.Client
	// PresignExpiry is how long an S3 download URL stays valid; default 24 hours.
	PresignExpiry time.Duration
	// MaxObjects bounds the objects one mount may list; default 10000.
	MaxObjects int
}

// Client implements nodefiles.Buckets. Safe for concurrent use; its SDK clients are made on
// first use, so a machine without cloud credentials pays nothing until a task mounts a bucket.
type Client struct {
	opts Options

	s3Once sync.Once
	s3     *s3.Client
	s3Err  error

	gcsOnce sync.Once
	gcs     *storage.Service
	gcsErr  error

	mu      sync.Mutex
	regions map[string]string // bucket -> its region
}

var _ nodefiles.Buckets = (*Client)(nil)

// New returns a Client; it contacts nothing.
func New(opts Options) *Client {
	if opts.PresignExpiry <= 0 {
		opts.PresignExpiry = 24 * time.Hour
	}
	if opts.MaxObjects <= 0 {
		opts.MaxObjects = 10000
	}
	if opts.S3Endpoint == "" {
		opts.S3Endpoint = os.Getenv("AWS_ENDPOINT_URL_S3")
	}
	if opts.S3Region == "" {
		opts.S3Region = os.Getenv("AWS_REGION")
	}
	if opts.S3Region == "" {
		opts.S3Region = "us-east-1"
	}
	if opts.GCSEndpoint == "" {
		if h := os.Getenv("STORAGE_EMULATOR_HOST"); h != "" {
			if !strings.Contains(h, "://") {
				h = "http://" + h
			}
			opts.GCSEndpoint = h
		}
	}
	return &Client{opts: opts, regions: map[string]string{}}
}

// List returns the objects under u: the one object u names, else those under u's prefix as a
// directory. None is an error: a copy of nothing is a mistake in the task.
func (c *Client) List(ctx context.Context, u nodefiles.BucketURL) ([]nodefiles.BucketObject, error) {
	objs, err := c.ListMount(ctx, u)
	if err != nil {
		return nil, err
	}
	if len(objs) == 0 {
		return nil, fmt.Errorf("%w: %s: no objects there", nodefiles.ErrFiles, u)
	}
	return objs, nil
}

// ListMount returns the objects under u as List does, but none is no error: a mounted
// bucket (an empty checkpoint directory) may start empty. The bucket must exist.
func (c *Client) ListMount(ctx context.Context, u nodefiles.BucketURL) ([]nodefiles.BucketObject, error) {
	var objs []nodefiles.BucketObject
	var err error
	switch u.Scheme {
	case "s3":
		objs, err = c.listS3(ctx, u)
	case "gs":
		objs, err = c.listGCS(ctx, u)
	default:
		return nil, fmt.Errorf("%w: %s: unsupported scheme", nodefiles.ErrFiles, u)
	}
	if err != nil {
		return nil, err
	}
	if len(objs) > c.opts.MaxObjects {
		return nil, fmt.Errorf("%w: %s: over %d objects; mount a narrower prefix", nodefiles.ErrFiles, u, c.opts.MaxObjects)
	}
	return objs, nil
}

// CheckBucket says whether u's bucket exists and these credentials may list u's prefix,
// reading one object at most: the check before a bucket is mounted, whatever it holds.
func (c *Client) CheckBucket(ctx context.Context, u nodefiles.BucketURL) error {
	prefix := u.DirPrefix()
	switch u.Scheme {
	case "s3":
		cl, err := c.s3For(ctx, u.Bucket)
		if err != nil {
			return err
		}
		if _, err := cl.ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: &u.Bucket, Prefix: &prefix, MaxKeys: awssdk.Int32(1)}); err != nil {
			return s3Error(u, err)
		}
	case "gs":
		svc, err := c.gcsService(ctx)
		if err != nil {
			return err
		}
		if _, err := svc.Objects.List(u.Bucket).Prefix(prefix).MaxResults(1).Context(ctx).Do(); err != nil {
			return gcsError(u, err)
		}
	default:
		return fmt.Errorf("%w: %s: unsupported scheme", nodefiles.ErrFiles, u)
	}
	return nil
}

// Put uploads one object and returns its ETag (ListMount's for the same content).
func (c *Client) Put(ctx context.Context, u nodefiles.BucketURL, key string, body io.ReadSeeker, size int64) (string, error) {
	switch u.Scheme {
	case "s3":
		cl, err := c.s3For(ctx, u.Bucket)
		if err != nil {
			return "", err
		}
		out, err := cl.PutObject(ctx, &s3.PutObjectInput{Bucket: &u.Bucket, Key: &key, Body: body, ContentLength: &size})
		if err != nil {
			return "", s3Error(u, err)
		}
		return awssdk.ToString(out.ETag), nil
	case "gs":
		svc, err := c.gcsService(ctx)
		if err != nil {
			return "", err
		}
		o, err := svc.Objects.Insert(u.Bucket, &storage.Object{Name: key}).Media(body, googleapi.ChunkSize(0)).Context(ctx).Do()
		if err != nil {
			return "", gcsError(u, err)
		}
		return o.Md5Hash, nil
	}
	return "", fmt.Errorf("%w: %s: unsupported scheme", nodefiles.ErrFiles, u)
}

// Delete removes one object; one already gone is no error.
func (c *Client) Delete(ctx context.Context, u nodefiles.BucketURL, key string) error {
	switch u.Scheme {
	case "s3":
		cl, err := c.s3For(ctx, u.Bucket)
		if err != nil {
			return err
		}
		if _, err := cl.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &u.Bucket, Key: &key}); err != nil {
			return s3Error(u, err)
		}
		return nil
	case "gs":
		svc, err := c.gcsService(ctx)
		if err != nil {
			return err
		}
		err = svc.Objects.Delete(u.Bucket, key).Context(ctx).Do()
		var ge *googleapi.Error
		if err != nil && !(errors.As(err, &ge) && ge.Code == http.StatusNotFound) {
			return gcsError(u, err)
		}
		return nil
	}
	return fmt.Errorf("%w: %s: unsupported scheme", nodefiles.ErrFiles, u)
}

// Open reads one object.
func (c *Client) Open(ctx context.Context, u nodefiles.BucketURL, key string) (io.ReadCloser, error) {
	switch u.Scheme {
	case "s3":
		cl, err := c.s3For(ctx, u.Bucket)
		if err != nil {
			return nil, err
		}
		out, err := cl.GetObject(ctx, &s3.GetObjectInput{Bucket: &u.Bucket, Key: &key})
		if err != nil {
			return nil, s3Error(u, err)
		}
		return out.Body, nil
	case "gs":
		svc, err := c.gcsService(ctx)
		if err != nil {
			return nil, err
		}
		resp, err := svc.Objects.Get(u.Bucket, key).Context(ctx).Download()
		if err != nil {
			return nil, gcsError(u, err)
		}
		return resp.Body, nil
	}
	return nil, fmt.Errorf("%w: %s: unsupported scheme", nodefiles.ErrFiles, u)
}

// DownloadURL is a presigned GET for S3, the JSON API's media URL for GCS.
func (c *Client) DownloadURL(ctx context.Context, u nodefiles.BucketURL, key string) (nodefiles.Download, error) {
	switch u.Scheme {
	case "s3":
		cl, err := c.s3For(ctx, u.Bucket)
		if err != nil {
			return nodefiles.Download{}, err
		}
		req, err := s3.NewPresignClient(cl).PresignGetObject(ctx, &s3.GetObjectInput{Bucket: &u.Bucket, Key: &key},
			s3.WithPresignExpires(c.opts.PresignExpiry))
		if err != nil {
			return nodefiles.Download{}, fmt.Errorf("presign %s/%s: %w", u.Bucket, key, err)
		}
		return nodefiles.Download{URL: req.URL}, nil
	case "gs":
		return nodefiles.Download{URL: c.gcsRoot() + "/storage/v1/b/" + url.PathEscape(u.Bucket) + "/o/" + url.PathEscape(key) + "?alt=media", NeedsGCSAuth: true}, nil
	}
	return nodefiles.Download{}, fmt.Errorf("%w: %s: unsupported scheme", nodefiles.ErrFiles, u)
}

func (c *Client) gcsRoot() string {
	if c.opts.GCSEndpoint != "" {
		return strings.TrimSuffix(c.opts.GCSEndpoint, "/")
	}
	return "https://storage.googleapis.com"
}

// s3Client is the client for region.
func (c *Client) s3Client(ctx context.Context) (*s3.Client, error) {
	c.s3Once.Do(func() {
		load := []func(*config.LoadOptions) error{config.WithRegion(c.opts.S3Region)}
		if c.opts.Credentials != nil {
			load = append(load, config.WithCredentialsProvider(c.opts.Credentials))
		}
		cfg, err := config.LoadDefaultConfig(ctx, load...)
		if err != nil {
			c.s3Err = fmt.Errorf("s3: load SDK config: %w", err)
			return
		}
		c.s3 = s3.NewFromConfig(cfg, func(o *s3.Options) {
			if c.opts.S3Endpoint != "" {
				o.BaseEndpoint = awssdk.String(c.opts.S3Endpoint)
				o.UsePathStyle = true
			}
		})
	})
	return c.s3, c.s3Err
}

// s3For is the client that signs for bucket's region, learnt once per bucket by HeadBucket
// (which also tells a missing bucket early).
func (c *Client) s3For(ctx context.Context, bucket string) (*s3.Client, error) {
	cl, err := c.s3Client(ctx)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	region, known := c.regions[bucket]
	c.mu.Unlock()
	if !known {
		out, err := cl.HeadBucket(ctx, &s3.HeadBucketInput{Bucket: &bucket})
		region = c.opts.S3Region
		switch {
		case err == nil && awssdk.ToString(out.BucketRegion) != "":
			region = awssdk.ToString(out.BucketRegion)
		case err != nil:
			if r := redirectRegion(err); r != "" {
				region = r
			} else {
				return nil, s3Error(nodefiles.BucketURL{Scheme: "s3", Bucket: bucket}, err)
			}
		}
		c.mu.Lock()
		c.regions[bucket] = region
		c.mu.Unlock()
	}
	if region == c.opts.S3Region {
		return cl, nil
	}
	return s3.New(cl.Options(), func(o *s3.Options) { o.Region = region }), nil
}

// redirectRegion is the region S3 names when it answers a HEAD for a bucket elsewhere (301).
func redirectRegion(err error) string {
	var re interface{ HTTPStatusCode() int }
	if !errors.As(err, &re) || re.HTTPStatusCode() != http.StatusMovedPermanently {
		return ""
	}
	var resp interface{ HTTPResponse() *http.Response }
	if errors.As(err, &resp) && resp.HTTPResponse() != nil {
		return resp.HTTPResponse().Header.Get("X-Amz-Bucket-Region")
	}
	return ""
}

func (c *Client) listS3(ctx context.Context, u nodefiles.BucketURL) ([]nodefiles.BucketObject, error) {
	cl, err := c.s3For(ctx, u.Bucket)
	if err != nil {
		return nil, err
	}
	if u.Prefix != "" && !strings.HasSuffix(u.Prefix, "/") {
		if out, err := cl.HeadObject(ctx, &s3.HeadObjectInput{Bucket: &u.Bucket, Key: &u.Prefix}); err == nil {
			return []nodefiles.BucketObject{{Key: u.Prefix, Size: awssdk.ToInt64(out.ContentLength), ETag: awssdk.ToString(out.ETag)}}, nil
		}
	}
	var objs []nodefiles.BucketObject
	prefix := u.DirPrefix()
	p := s3.NewListObjectsV2Paginator(cl, &s3.ListObjectsV2Input{Bucket: &u.Bucket, Prefix: &prefix})
	for p.HasMorePages() && len(objs) <= c.opts.MaxObjects {
		page, err := p.NextPage(ctx)
		if err != nil {
			return nil, s3Error(u, err)
		}
		for _, o := range page.Contents {
			if strings.HasSuffix(awssdk.ToString(o.Key), "/") {
				continue // a console-made "folder"
			}
			objs = append(objs, nodefiles.BucketObject{Key: awssdk.ToString(o.Key), Size: awssdk.ToInt64(o.Size), ETag: awssdk.ToString(o.ETag)})
		}
	}
	return objs, nil
}

// s3Error says what a missing bucket or a refusal means for the task.
func s3Error(u nodefiles.BucketURL, err error) error {
	var nsb *s3types.NoSuchBucket
	var api smithy.APIError
	switch {
	case errors.As(err, &nsb):
		return fmt.Errorf("%w: s3://%s: bucket not found", nodefiles.ErrFiles, u.Bucket)
	case errors.As(err, &api) && (api.ErrorCode() == "NotFound" || api.ErrorCode() == "NoSuchBucket"):
		return fmt.Errorf("%w: s3://%s: bucket not found", nodefiles.ErrFiles, u.Bucket)
	case errors.As(err, &api) && (api.ErrorCode() == "AccessDenied" || api.ErrorCode() == "Forbidden"):
		return fmt.Errorf("%w: %s: access denied to the AWS credentials it was read with", nodefiles.ErrFiles, u)
	}
	return fmt.Errorf("%s: %w", u, err)
}

func (c *Client) gcsService(ctx context.Context) (*storage.Service, error) {
	c.gcsOnce.Do(func() {
		var opts []option.ClientOption
		if c.opts.GCSEndpoint != "" {
			opts = append(opts, option.WithEndpoint(c.gcsRoot()+"/storage/v1/"))
			if len(c.opts.GCSOptions) == 0 {
				opts = append(opts, option.WithoutAuthentication())
			}
		}
		opts = append(opts, c.opts.GCSOptions...)
		c.gcs, c.gcsErr = storage.NewService(ctx, opts...)
		if c.gcsErr != nil {
			c.gcsErr = fmt.Errorf("gcs: %w", c.gcsErr)
		}
	})
	return c.gcs, c.gcsErr
}

func (c *Client) listGCS(ctx context.Context, u nodefiles.BucketURL) ([]nodefiles.BucketObject, error) {
	svc, err := c.gcsService(ctx)
	if err != nil {
		return nil, err
	}
	if u.Prefix != "" && !strings.HasSuffix(u.Prefix, "/") {
		if o, err := svc.Objects.Get(u.Bucket, u.Prefix).Context(ctx).Do(); err == nil {
			return []nodefiles.BucketObject{{Key: o.Name, Size: int64(o.Size), ETag: o.Md5Hash}}, nil
		}
	}
	var objs []nodefiles.BucketObject
	call := svc.Objects.List(u.Bucket).Prefix(u.DirPrefix()).Context(ctx)
	err = call.Pages(ctx, func(page *storage.Objects) error {
		for _, o := range page.Items {
			if !strings.HasSuffix(o.Name, "/") {
				objs = append(objs, nodefiles.BucketObject{Key: o.Name, Size: int64(o.Size), ETag: o.Md5Hash})
			}
		}
		if len(objs) > c.opts.MaxObjects {
			return errTooMany
		}
		return nil
	})
	if err != nil && !errors.Is(err, errTooMany) {
		return nil, gcsError(u, err)
	}
	return objs, nil
}

var errTooMany = errors.New("too many objects")

func gcsError(u nodefiles.BucketURL, err error) error {
	var ge *googleapi.Error
	if errors.As(err, &ge) {
		switch ge.Code {
		case http.StatusNotFound:
			return fmt.Errorf("%w: %s: bucket or object not found", nodefiles.ErrFiles, u)
		case http.StatusForbidden, http.StatusUnauthorized:
			return fmt.Errorf("%w: %s: access denied to this machine's Google credentials", nodefiles.ErrFiles, u)
		}
	}
	return fmt.Errorf("%s: %w", u, err)
}
