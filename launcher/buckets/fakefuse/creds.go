package fakefuse

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"golang.org/x/oauth2"
	"google.golang.org/api/option"

	"github.com/ferryserve/ferry/launcher/buckets"
)

// metadataTimeout bounds one call to a metadata service.
const metadataTimeout = 10 * time.Second

// newStore is the bucket client the mount uses, with the machine's credentials.
func newStore(m mountArgs) (*buckets.Client, error) {
	endpoint := m.endpoint // else buckets.New reads AWS_ENDPOINT_URL_S3
	var creds awssdk.CredentialsProvider
	if id := os.Getenv("AWS_ACCESS_KEY_ID"); id != "" {
		creds = credentials.NewStaticCredentialsProvider(id, os.Getenv("AWS_SECRET_ACCESS_KEY"), os.Getenv("AWS_SESSION_TOKEN"))
	} else {
		creds = awssdk.NewCredentialsCache(imdsRole{base: envOr("FERRY_IMDS_ENDPOINT", "http://169.254.169.254")})
	}
	ts := oauth2.ReuseTokenSource(nil, gceToken{base: envOr("FERRY_GCE_METADATA_URL", "http://metadata.google.internal")})
	return buckets.New(buckets.Options{S3Endpoint: endpoint, Credentials: creds,
		GCSOptions: []option.ClientOption{option.WithTokenSource(ts)}}), nil
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// imdsRole reads the instance profile's role credentials from the EC2 instance metadata
// service, IMDSv2, as the AWS SDK's default chain does on an EC2 VM.
type imdsRole struct{ base string }

var _ awssdk.CredentialsProvider = imdsRole{}

// Retrieve implements aws.CredentialsProvider.
func (r imdsRole) Retrieve(ctx context.Context) (awssdk.Credentials, error) {
	ctx, cancel := context.WithTimeout(ctx, metadataTimeout)
	defer cancel()
	token, err := r.call(ctx, http.MethodPut, "/latest/api/token", "")
	if err != nil {
		return awssdk.Credentials{}, fmt.Errorf("instance metadata token: %w", err)
	}
	roles, err := r.call(ctx, http.MethodGet, "/latest/meta-data/iam/security-credentials/", token)
	if err != nil {
		return awssdk.Credentials{}, fmt.Errorf("no instance profile (the VM has no IAM role to mount s3:// with): %w", err)
	}
	role, _, _ := strings.Cut(strings.TrimSpace(roles), "\n")
	body, err := r.call(ctx, http.MethodGet, "/latest/meta-data/iam/security-credentials/"+role, token)
	if err != nil {
		return awssdk.Credentials{}, fmt.Errorf("role %s credentials: %w", role, err)
	}
	var c struct {
		AccessKeyID     string `json:"AccessKeyId"`
		SecretAccessKey string
		Token           string
		Expiration      time.Time
	}
	if err := json.Unmarshal([]byte(body), &c); err != nil {
		return awssdk.Credentials{}, fmt.Errorf("role %s credentials: %w", role, err)
	}
	return awssdk.Credentials{AccessKeyID: c.AccessKeyID, SecretAccessKey: c.SecretAccessKey, SessionToken: c.Token,
		CanExpire: true, Expires: c.Expiration.Add(-5 * time.Minute), Source: "fakefuse: instance metadata"}, nil
}

func (r imdsRole) call(ctx context.Context, method, path, token string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimSuffix(r.base, "/")+path, nil)
	if err != nil {
		return "", err
	}
	if token == "" {
		req.Header.Set("X-aws-ec2-metadata-token-ttl-seconds", "21600")
	} else {
		req.Header.Set("X-aws-ec2-metadata-token", token)
	}
	return metadataCall(req)
}

// gceToken is the GCE metadata server's token for the VM's service account, as Application
// Default Credentials find it on a GCE VM.
type gceToken struct{ base string }

var _ oauth2.TokenSource = gceToken{}

// Token implements oauth2.TokenSource.
func (g gceToken) Token() (*oauth2.Token, error) {
	ctx, cancel := context.WithTimeout(context.Background(), metadataTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(g.base, "/")+"/computeMetadata/v1/instance/service-accounts/default/token", nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Metadata-Flavor", "Google")
	body, err := metadataCall(req)
	if err != nil {
		return nil, fmt.Errorf("service-account token (the VM has no service account to mount gs:// with): %w", err)
	}
	var t struct {
		AccessToken string `json:"access_token"`
		ExpiresIn   int    `json:"expires_in"`
	}
	if err := json.Unmarshal([]byte(body), &t); err != nil || t.AccessToken == "" {
		return nil, fmt.Errorf("service-account token: %q", body)
	}
	return &oauth2.Token{AccessToken: t.AccessToken, TokenType: "Bearer", Expiry: time.Now().Add(time.Duration(t.ExpiresIn) * time.Second)}, nil
}

// metadataCall makes one metadata request and returns its body; not 200 is an error.
func metadataCall(req *http.Request) (string, error) {
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%s %s: %s", req.Method, req.URL.Path, resp.Status)
	}
	return string(b), nil
}
