package configs

import (
	"reflect"
	"testing"

	"gopkg.in/yaml.v3"
)

// TestSectionFieldsTagged checks that every field of a task section has a yaml tag: ResolvedYAML
// writes only tagged fields, so an untagged one would silently drop out of it. A field that
// is held but not written says so with yaml:"-".
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
	if len(seen) < 10 {
		t.Fatalf("walked only %d section types", len(seen))
	}
}
