package extmetrics

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Attributes are what a request asks to do: list a metric in a namespace.
type Attributes struct {
	Verb, Namespace, Metric string
}

// Authorizer decides whether a user may do what a request asks; reason says why not.
type Authorizer interface {
	Authorize(ctx context.Context, u User, a Attributes) (allowed bool, reason string, err error)
}

// SubjectAccessReviewer asks the API server, as aggregated servers delegate authorization: a
// SubjectAccessReview per user and request, on the resource named after the metric in
// external.metrics.k8s.io (the HPA controller's ClusterRole grants it on every resource). The
// answers are kept for TTL, as k8s.io/apiserver's delegating authorizer keeps them, so an HPA
// syncing every 15 s costs one review per TTL. The client needs create on
// subjectaccessreviews (the ClusterRole system:auth-delegator).
type SubjectAccessReviewer struct {
	client kubernetes.Interface
	ttl    time.Duration
	now    func() time.Time

	mu      sync.Mutex
	answers map[string]reviewAnswer
}

var _ Authorizer = (*SubjectAccessReviewer)(nil)

type reviewAnswer struct {
	allowed bool
	reason  string
	until   time.Time
}

// NewSubjectAccessReviewer returns an authorizer that asks through client; ttl <= 0 takes 10 s.
func NewSubjectAccessReviewer(client kubernetes.Interface, ttl time.Duration) *SubjectAccessReviewer {
	if ttl <= 0 {
		ttl = 10 * time.Second
	}
	return &SubjectAccessReviewer{client: client, ttl: ttl, now: time.Now, answers: map[string]reviewAnswer{}}
}

// Authorize implements Authorizer.
func (s *SubjectAccessReviewer) Authorize(ctx context.Context, u User, a Attributes) (bool, string, error) {
	key := reviewKey(u, a)
	now := s.now()
	s.mu.Lock()
	answer, ok := s.answers[key]
	s.mu.Unlock()
	if ok && now.Before(answer.until) {
		return answer.allowed, answer.reason, nil
	}
	extra := map[string]authorizationv1.ExtraValue{}
	for k, v := range u.Extra {
		extra[k] = v
	}
	review, err := s.client.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
		Spec: authorizationv1.SubjectAccessReviewSpec{
			User: u.Name, UID: u.UID, Groups: u.Groups, Extra: extra,
			ResourceAttributes: &authorizationv1.ResourceAttributes{
				Namespace: a.Namespace, Verb: a.Verb, Group: Group, Version: Version, Resource: a.Metric,
			},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return false, "", err
	}
	answer = reviewAnswer{allowed: review.Status.Allowed && !review.Status.Denied, reason: review.Status.Reason, until: now.Add(s.ttl)}
	s.mu.Lock()
	for k, old := range s.answers {
		if !now.Before(old.until) {
			delete(s.answers, k)
		}
	}
	s.answers[key] = answer
	s.mu.Unlock()
	return answer.allowed, answer.reason, nil
}

// reviewKey identifies a question: the same user, groups and extra asking the same thing.
func reviewKey(u User, a Attributes) string {
	var b strings.Builder
	for _, s := range []string{u.Name, u.UID, strings.Join(u.Groups, "\x01"), a.Verb, a.Namespace, a.Metric} {
		b.WriteString(s)
		b.WriteByte(0)
	}
	keys := make([]string, 0, len(u.Extra))
	for k := range u.Extra {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		b.WriteString(k + "=" + strings.Join(u.Extra[k], "\x01"))
		b.WriteByte(0)
	}
	return b.String()
}
