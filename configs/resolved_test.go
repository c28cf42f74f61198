package configs

import (
	"reflect"
	"slices"
	"testing"

	"gopkg.in/yaml.v3"
)

// TestSectionFieldsTagged checks that every field of a task or ferry config section has a yaml
// tag: ResolvedYAML writes only tagged fields and keysOf accepts only them, so an untagged one
// would silently drop out. A field that is held but not written says so with yaml:"-".
func TestSectionFieldsTagged(t *testing.T) {
	pkg := reflect.TypeFor[Task]().PkgPath()
	seen := map[reflect.Type]bool{}
	var walk func(reflect.Type)
	walk = func(typ reflect.Type) {
		for typ.Kind() == reflect.Pointer || typ.Kind() == reflect.Slice || typ.Kind() == reflect.Map {
			typ = typ.Elem()
		}
		if typ.Kind() != reflect.Struct || typ.PkgPath() != pkg || seen[typ] {
			return
		}
		seen[typ] = true
		if typ.Implements(reflect.TypeFor[yaml.Marshaler]()) || typ == reflect.TypeFor[Accelerator]() {
			return // writes itself, or is written by Resources.resolvedValue as "A100:1" or A100: 1
		}
		for i := range typ.NumField() {
			f := typ.Field(i)
			if _, ok := f.Tag.Lookup("yaml"); !ok && f.IsExported() {
				t.Errorf("%s.%s has no yaml tag", typ.Name(), f.Name)
			}
			if f.Tag.Get("yaml") != "-" {
				walk(f.Type)
			}
		}
	}
	walk(reflect.TypeFor[Task]())
	walk(reflect.TypeFor[FerryConfig]())
	if len(seen) < 10 {
		t.Fatalf("walked only %d section types", len(seen))
	}
}

// TestExplicitKeysCoverFields checks the allowed-key lists that are written out rather than
// taken from a section's tags (keysOf) still accept every field the section has, so a field
// added to the struct cannot be forgotten there.
func TestExplicitKeysCoverFields(t *testing.T) {
	tests := map[string]struct {
		listed []string
		fields []string
		exact  bool // the list holds the fields and nothing else
	}{
		"resources":      {listed: resourceKeys, fields: keysOf[Resources]()},
		"replica_policy": {listed: policyKeys, fields: keysOf[ReplicaPolicy](), exact: true},
		"autostop":       {listed: autostopKeys, fields: keysOf[Autostop]()},
		"aws and gcp":    {listed: append(slices.Clone(awsKeys), gcpKeys...), fields: keysOf[CloudConfig](), exact: true},
	}
	for name, tt := range tests {
		for _, key := range tt.fields {
			if !slices.Contains(tt.listed, key) {
				t.Errorf("%s: field %s is not among the accepted keys %v", name, key, tt.listed)
			}
		}
		if !tt.exact {
			continue
		}
		for _, key := range tt.listed {
			if !slices.Contains(tt.fields, key) {
				t.Errorf("%s: key %s has no field", name, key)
			}
		}
	}
}
