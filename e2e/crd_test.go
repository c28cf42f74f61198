package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"

	"github.com/ferryserve/ferry/internal/testcluster"
)

// TestCRDCommand runs the built binary's `ferry crd apply` against the test cluster's API
// server, as an admin upgrading would (charts/ferry's TestApplyCRDsUpgradesInPlace covers an
// older CRD brought up to date in place): it leaves the CRD served and says what it did, a
// second run changes nothing, and `ferry crd print` is the chart's crds/ file, object for
// object.
func TestCRDCommand(t *testing.T) {
	c := testcluster.Shared(t)
	run := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(ferryBin, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("ferry %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	apply := []string{"crd", "apply", "--kubeconfig", c.Kubeconfig(), "--kube-context", c.Context()}
	first := run(apply...)
	if !regexp.MustCompile(`^customresourcedefinition ferryservices\.ferry\.dev (created|updated \(generation \d+ to \d+\)|unchanged)\n$`).MatchString(first) {
		t.Errorf("ferry crd apply said %q", first)
	}
	if again := run(apply...); again != "customresourcedefinition ferryservices.ferry.dev unchanged\n" {
		t.Errorf("ferry crd apply again said %q, want unchanged", again)
	}
	dyn, err := dynamic.NewForConfig(c.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dyn.Resource(crdGVR).Get(context.Background(), "ferryservices.ferry.dev", metav1.GetOptions{}); err != nil {
		t.Fatalf("the CRD after ferry crd apply: %v", err)
	}

	var printed, file map[string]any
	if err := yaml.Unmarshal([]byte(run("crd", "print")), &printed); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(repoRoot(), "charts/ferry/crds/ferryservices.ferry.dev.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(raw, &file); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(printed, file) {
		t.Errorf("ferry crd print is not charts/ferry/crds/ferryservices.ferry.dev.yaml:\n%v\nwant\n%v", printed, file)
	}
}
