package sourcecheck

import (
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// The import rules of docs/ARCHITECTURE.md, checked on every production file of the module (no
// tests, no bench or e2e drivers): data flows one way through the control plane, the pure
// decision packages stay free of I/O, and the API routes without knowing the proxy.

const module = "github.com/ferryserve/ferry/"

// importRule says which of the module's packages a package (and those under it, unless a more
// specific rule names them) may import. allow lists path prefixes.
type importRule struct {
	pkg   string
	allow []string
}

var importRules = []importRule{
	{"configs", nil},                        // the schema imports no runtime package
	{"policy", []string{"policy/blocklru"}}, // pure decisions over snapshots: the standard library only, and its own LRU set
	{"policy/blocklru", nil},
	{"autoscaler", []string{"configs"}},
	{"launcher", []string{"configs", "policy", "launcher"}}, // the providers: know nothing of services or requests
	{"launcher/nodefiles", []string{"configs", "launcher"}}, // a node's script and files, on every infra
	{"launcher/vmnode", []string{"configs", "launcher"}},    // a VM node's boot script and console, for the VM clouds
	{"replicas", []string{"configs", "launcher", "policy"}}, // not autoscaler (how many is handed in), not proxy
	{"jobs", []string{"configs", "launcher"}},               // never learns which cloud runs a node, nor that services exist
	{"proxy", []string{"policy", "tenants"}},
	{"proxy/attach", []string{"configs", "proxy", "internal/rpc", "internal/home", "tenants"}}, // the standalone proxy links neither jobs, replicas nor launcher
	{"proxy/kvevents", []string{"policy"}},                                                     // the engines' KV-cache events, decoded into policy.KVBlocks
	{"internal/rpc", []string{"internal/home"}},                                                // tokens, routes, errors, dialing: no domain
	{"internal/api", []string{"configs", "internal/home", "internal/rpc", "jobs", "launcher", "replicas", "tenants"}}, // routes; the proxy is not its business; launcher for infra health and leftovers
	{"internal/store", []string{"configs", "jobs", "launcher", "replicas", "internal/store", "tenants"}},              // kubestore and storetest build on the interface; launcher for the leftovers ledger; tenants' keys and usage
	{"internal/home", nil},
	{"tenants", nil}, // keys, limits and usage: pure, shared by the proxy, the follower and the controller
	{"internal/infra", []string{"configs", "internal/home", "launcher"}},
	{"internal/leader", nil},     // client-go's election only; the controller hands its term to the store
	{"internal/extmetrics", nil}, // the external metrics API: values come from a Source the controller implements
	{"internal/controller", []string{"autoscaler", "configs", "internal/api", "internal/extmetrics", "internal/rpc", "internal/home", "internal/infra", "internal/leader", "internal/store",
		"jobs", "launcher", "policy", "proxy", "replicas", "tenants"}},
}

// packageRules are rules for one package alone, not those under it, which importRules cover:
// the provider contract imports none of what its providers share (nodefiles, vmnode), nor any
// provider.
var packageRules = []importRule{
	{"launcher", []string{"configs"}},
}

// ruleFor is the rule for pkg alone, else the most specific rule covering pkg.
func ruleFor(pkg string) (importRule, bool) {
	for _, r := range packageRules {
		if r.pkg == pkg {
			return r, true
		}
	}
	best, found := importRule{}, false
	for _, r := range importRules {
		if (pkg == r.pkg || strings.HasPrefix(pkg, r.pkg+"/")) && len(r.pkg) >= len(best.pkg) {
			best, found = r, true
		}
	}
	return best, found
}

func TestImportRules(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	checked := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			if strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		pkg := filepath.ToSlash(filepath.Dir(rel))
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		checked++
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			if !strings.HasPrefix(p, module) {
				continue
			}
			checkImport(t, rel, pkg, strings.TrimPrefix(p, module))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 100 {
		t.Fatalf("checked only %d files under %s: is the walk rooted right?", checked, root)
	}
}

// checkImport fails t when the file rel of package pkg may not import dep.
func checkImport(t *testing.T, rel, pkg, dep string) {
	t.Helper()
	// internal/testcluster is test support, never linked into the binary (checked below): its
	// kubelet stand-in may serve the replica simulator in its own process.
	simulates := (pkg == "cmd/ferry" && (dep == "bench/replicasim" || dep == "bench/sim" || dep == "bench/trainsim")) ||
		(pkg == "internal/testcluster" && dep == "bench/replicasim")
	switch {
	case strings.HasPrefix(dep, "bench/") && !strings.HasPrefix(pkg, "bench/") && !strings.HasPrefix(pkg, "e2e") && !simulates:
		t.Errorf("%s imports %s: production code imports no bench driver (the binary serves the replica simulator and runs ferry sim)", rel, dep)
	case dep == "internal/testcluster" && !strings.HasPrefix(pkg, "bench/") && !strings.HasPrefix(pkg, "e2e"):
		t.Errorf("%s imports %s: the test cluster is for tests and bench drivers, never the binary", rel, dep)
	case (strings.HasPrefix(dep, "cmd/") || dep == "internal/controller") && !strings.HasPrefix(pkg, "cmd/") &&
		!strings.HasPrefix(pkg, "bench/") && !strings.HasPrefix(pkg, "e2e"):
		t.Errorf("%s imports %s: only the binary wires the controller", rel, dep)
	}
	rule, ok := ruleFor(pkg)
	if !ok || dep == pkg {
		return
	}
	if !slices.ContainsFunc(rule.allow, func(a string) bool { return dep == a || strings.HasPrefix(dep, a+"/") }) {
		t.Errorf("%s (package %s) imports %s; the rule for %s allows only %v", rel, pkg, dep, rule.pkg, rule.allow)
	}
}
