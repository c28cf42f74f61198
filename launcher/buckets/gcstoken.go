package buckets

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"golang.org/x/oauth2"
	"golang.org/x/oauth2/google"
	"golang.org/x/oauth2/google/downscope"
	storage "google.golang.org/api/storage/v1"

	"github.com/ferryserve/ferry/launcher/nodefiles"
)

// A VM without a Google service account (an EC2 VM) fetches a task's gs:// copies with a
// bearer token the controller lends it in its boot script: the controller's own credentials'
// access token, narrowed by a Credential Access Boundary (Google's Security Token Service) to
// reading objects under the copied prefixes, and valid as long as the token it came from, an
// hour at most. It sits in the VM's user-data as the task's secrets do; whoever reads that
// within the hour can read those objects, nothing else.

var _ nodefiles.GCSReader = (*Client)(nil)

// maxBoundaryRules is how many rules a Credential Access Boundary may hold.
const maxBoundaryRules = 10

// GCSReadToken implements nodefiles.GCSReader: a token that reads the objects under us.
func (c *Client) GCSReadToken(ctx context.Context, us []nodefiles.BucketURL) (string, error) {
	root, err := c.lendingSource(ctx)
	if err != nil {
		return "", err
	}
	rules, err := readRules(us)
	if err != nil {
		return "", err
	}
	if c.opts.STSClient != nil {
		ctx = context.WithValue(ctx, oauth2.HTTPClient, c.opts.STSClient)
	}
	ts, err := downscope.NewTokenSource(ctx, downscope.DownscopingConfig{RootSource: root, Rules: rules})
	if err != nil {
		return "", err
	}
	tok, err := ts.Token()
	if err != nil {
		return "", fmt.Errorf("narrow the controller's Google token to reading %s: %w", us[0], err)
	}
	return tok.AccessToken, nil
}

// lendingSource is the controller's Google credentials for lent tokens.
func (c *Client) lendingSource(ctx context.Context) (oauth2.TokenSource, error) {
	if c.opts.GCSTokenSource != nil {
		return c.opts.GCSTokenSource, nil
	}
	if c.opts.GCSEndpoint != "" {
		return nil, errors.New("no Google credentials to lend for the GCS endpoint " + c.opts.GCSEndpoint)
	}
	creds, err := google.FindDefaultCredentials(ctx, storage.DevstorageReadOnlyScope)
	if err != nil {
		return nil, fmt.Errorf("no Google credentials on the controller to lend (Application Default Credentials: %w)", err)
	}
	return creds.TokenSource, nil
}

// readRules are the access boundary's rules: read the objects under each URL.
func readRules(us []nodefiles.BucketURL) ([]downscope.AccessBoundaryRule, error) {
	var rules []downscope.AccessBoundaryRule
	seen := map[string]bool{}
	for _, u := range us {
		key := u.Bucket + "/" + u.Prefix
		if seen[key] {
			continue
		}
		seen[key] = true
		rule := downscope.AccessBoundaryRule{
			AvailableResource:    "//storage.googleapis.com/projects/_/buckets/" + u.Bucket,
			AvailablePermissions: []string{"inRole:roles/storage.objectViewer"},
		}
		if u.Prefix != "" {
			rule.Condition = &downscope.AvailabilityCondition{
				Title:      "ferry: objects under " + u.String(),
				Expression: "resource.name.startsWith('projects/_/buckets/" + u.Bucket + "/objects/" + strings.ReplaceAll(u.Prefix, "'", `\'`) + "')",
			}
		}
		rules = append(rules, rule)
	}
	if len(rules) > maxBoundaryRules {
		return nil, fmt.Errorf("%w: %d gs:// sources; a lent token covers at most %d", nodefiles.ErrFiles, len(rules), maxBoundaryRules)
	}
	slices.SortFunc(rules, func(a, b downscope.AccessBoundaryRule) int {
		return strings.Compare(a.AvailableResource, b.AvailableResource)
	})
	return rules, nil
}
