package leader

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	coordinationclient "k8s.io/client-go/kubernetes/typed/coordination/v1"
	rl "k8s.io/client-go/tools/leaderelection/resourcelock"
)

// AnnotationURL on the Lease is the API URL of its holder: followers forward the API there and
// name it in X-Ferry-Leader, so proxies and clients find the leader without a Service per pod.
const AnnotationURL = "ferry.dev/leader-url"

// leaseLock is client-go's resourcelock.LeaseLock plus two things Ferry needs: every write
// sets the holder's URL annotation (one writer, so no conflict with a separate patch), and
// each successful write by this identity is reported to onWrite with the time the request
// started, which is what Term's "in doubt" deadline counts from.
type leaseLock struct {
	client    coordinationclient.LeasesGetter
	namespace string
	name      string
	identity  string
	url       string
	onWrite   func(started time.Time, rec rl.LeaderElectionRecord)

	lease *coordinationv1.Lease
}

var _ rl.Interface = (*leaseLock)(nil)

func (l *leaseLock) Get(ctx context.Context) (*rl.LeaderElectionRecord, []byte, error) {
	lease, err := l.client.Leases(l.namespace).Get(ctx, l.name, metav1.GetOptions{})
	if err != nil {
		return nil, nil, err
	}
	l.lease = lease
	rec := rl.LeaseSpecToLeaderElectionRecord(&lease.Spec)
	raw, err := json.Marshal(*rec)
	if err != nil {
		return nil, nil, err
	}
	return rec, raw, nil
}

func (l *leaseLock) Create(ctx context.Context, rec rl.LeaderElectionRecord) error {
	started := time.Now()
	lease := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: l.name, Namespace: l.namespace, Annotations: map[string]string{AnnotationURL: l.url}},
		Spec:       rl.LeaderElectionRecordToLeaseSpec(&rec),
	}
	created, err := l.client.Leases(l.namespace).Create(ctx, lease, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	l.lease = created
	l.onWrite(started, rec)
	return nil
}

func (l *leaseLock) Update(ctx context.Context, rec rl.LeaderElectionRecord) error {
	if l.lease == nil {
		return errors.New("lease not read yet")
	}
	started := time.Now()
	lease := l.lease.DeepCopy()
	lease.Spec = rl.LeaderElectionRecordToLeaseSpec(&rec)
	if lease.Annotations == nil {
		lease.Annotations = map[string]string{}
	}
	if rec.HolderIdentity == l.identity {
		lease.Annotations[AnnotationURL] = l.url
	}
	updated, err := l.client.Leases(l.namespace).Update(ctx, lease, metav1.UpdateOptions{})
	if err != nil {
		return err
	}
	l.lease = updated
	l.onWrite(started, rec)
	return nil
}

// RecordEvent is a no-op: the controller logs transitions itself, and events would need RBAC
// on events that nothing else needs.
func (l *leaseLock) RecordEvent(string) {}

func (l *leaseLock) Identity() string { return l.identity }

func (l *leaseLock) Describe() string { return l.namespace + "/" + l.name }
