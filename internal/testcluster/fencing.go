package testcluster

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"
)

// Fencing is which of charts/ferry's fencing policies InstallFencing creates.
type Fencing int

const (
	// FenceState is fencing-policy.yaml: the store's ConfigMaps and Secrets.
	FenceState Fencing = 1 << iota
	// FenceStatus is fencing-policy-status.yaml: FerryService status (needs the CRD).
	FenceStatus
)

// InstallFencing creates charts/ferry's fencing policies and bindings for namespace ns and the
// controller Lease lease, as the chart renders them for the release "ferry" with leader
// election: from then on the API server admits a write of Ferry's state only with the Lease's
// term and holder. The templates are read from the repository, so what is tested is what the
// chart installs. It returns once the API server enforces the state's policy (a policy takes
// effect a moment after it is stored).
//
// They are left in place when the namespace goes: their bindings match only ns, and the
// kube-apiserver (1.34) does not restart its Lease informer when the last policy with a Lease
// param goes and a new one comes, so a later policy would never see its Lease ("no params found").
func InstallFencing(ctx context.Context, client kubernetes.Interface, ns, lease string, which Fencing) error {
	root, err := RepoRoot()
	if err != nil {
		return err
	}
	var text strings.Builder
	for _, f := range []struct {
		kind Fencing
		file string
	}{{FenceState, "fencing-policy.yaml"}, {FenceStatus, "fencing-policy-status.yaml"}} {
		if which&f.kind == 0 {
			continue
		}
		raw, err := os.ReadFile(filepath.Join(root, "charts/ferry/templates", f.file))
		if err != nil {
			return err
		}
		if text.Len() > 0 {
			text.WriteString("\n---\n")
		}
		text.Write(raw)
	}
	rendered := renderFencing(text.String(), ns, lease)
	if strings.Contains(rendered, "{{") {
		return fmt.Errorf("the fencing policies use template values InstallFencing does not fill in:\n%s", rendered)
	}
	reg := client.AdmissionregistrationV1()
	for _, doc := range bytes.Split([]byte(rendered), []byte("\n---\n")) {
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &meta); err != nil {
			return err
		}
		switch meta.Kind {
		case "ValidatingAdmissionPolicy":
			var p admissionv1.ValidatingAdmissionPolicy
			if err := yaml.UnmarshalStrict(doc, &p); err != nil {
				return err
			}
			if _, err := reg.ValidatingAdmissionPolicies().Create(ctx, &p, metav1.CreateOptions{}); err != nil {
				return err
			}
		case "ValidatingAdmissionPolicyBinding":
			var b admissionv1.ValidatingAdmissionPolicyBinding
			if err := yaml.UnmarshalStrict(doc, &b); err != nil {
				return err
			}
			if _, err := reg.ValidatingAdmissionPolicyBindings().Create(ctx, &b, metav1.CreateOptions{}); err != nil {
				return err
			}
		default:
			return fmt.Errorf("fencing policies: unexpected kind %q", meta.Kind)
		}
	}
	if which&FenceState == 0 {
		return nil
	}
	return waitFenced(ctx, client, ns)
}

// waitFenced waits, bounded, until the API server refuses an unfenced write of a store object
// in ns: for its term, or for want of the Lease when there is none yet.
func waitFenced(ctx context.Context, client kubernetes.Interface, ns string) error {
	probe := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "ferry-fence-wait",
		Labels: map[string]string{"app.kubernetes.io/managed-by": "ferry", "ferry.dev/kind": "probe"}}}
	var err error
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		_, err = client.CoreV1().ConfigMaps(ns).Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if apierrors.IsForbidden(err) || apierrors.IsInvalid(err) {
			return nil
		}
	}
	return fmt.Errorf("the fencing policy never took effect in namespace %s: an unfenced write got %v", ns, err)
}

// renderFencing fills in the template values the fencing templates use, for the release
// "ferry" (_helpers.tpl names cluster-scoped objects ferry-NAME-NAMESPACE), and drops their
// comments and the `if .Values.controller.leaderElect` gate around them.
func renderFencing(text, ns, lease string) string {
	text = strings.ReplaceAll(text, "{{ .Release.Namespace }}", ns)
	text = regexp.MustCompile(`\{\{ include "ferry\.clusterName" \(list \$ "([a-z-]+)"\) \}\}`).ReplaceAllString(text, "ferry-${1}-"+ns)
	text = regexp.MustCompile(`\{\{ \.Values\.leaderElection\.leaseName[^}]*\}\}`).ReplaceAllString(text, lease)
	text = regexp.MustCompile(`(?s)\{\{- /\*.*?\*/ -\}\}\n`).ReplaceAllString(text, "")
	return regexp.MustCompile(`(?m)^\{\{- (?:if \.Values\.controller\.leaderElect|end) \}\}\n?`).ReplaceAllString(text, "")
}
