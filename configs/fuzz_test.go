package configs

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// FuzzParse checks that no input makes Parse panic, that every failure is reported as *Error
// values, and that every success renders to YAML that parses back to the same task. Its seed
// corpus (testdata/fuzz/FuzzParse plus Ferry's examples and SkyPilot's, whose accepted files
// must round-trip too) runs with every `go test`.
func FuzzParse(f *testing.F) {
	paths, _ := filepath.Glob("examples/*.yaml")
	_ = filepath.WalkDir("testdata/skypilot", func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(path, ".yaml") {
			paths = append(paths, path)
		}
		return err
	})
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		task, err := Parse("fuzz.yaml", data, Overrides{})
		if err != nil {
			errs := Errors(err)
			if len(errs) == 0 {
				t.Fatalf("error is not made of *Error: %v", err)
			}
			for _, e := range errs {
				if strings.Contains(e.Msg, "internal error") {
					t.Fatalf("Parse panicked: %v", e)
				}
			}
			return
		}
		out, err := task.ResolvedYAML()
		if err != nil {
			t.Fatalf("ResolvedYAML: %v", err)
		}
		again, err := Parse("resolved.yaml", out, Overrides{})
		if err != nil {
			t.Fatalf("resolved YAML does not parse: %v\n%s", err, out)
		}
		if diff := cmp.Diff(task.Redacted(), again, cmpopts.IgnoreFields(Task{}, "Source", "Notes"), cmpopts.EquateEmpty()); diff != "" {
			t.Fatalf("round trip changed the task (-want +got):\n%s\n%s", diff, out)
		}
		_ = task.Resources.String()
	})
}
