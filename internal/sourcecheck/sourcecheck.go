// Package sourcecheck holds checks on the shape of source code, for the properties no
// behavioural test can pin down reliably: a comparison of secrets taking the same time whatever
// the input, and (its own test) the import rules of docs/ARCHITECTURE.md. Only test code imports
// it.
package sourcecheck

import (
	"go/ast"
	"go/parser"
	"go/token"
	"testing"
)

// ConstantTimeCompare fails t unless the function (or method) named fn in file calls
// subtle.ConstantTimeCompare and compares nothing else in a way that can return early:
// no ==, != (except against an integer literal, such as the compare's 0/1 result, or the empty
// string, for "no secret configured"), bytes.Equal, strings.EqualFold and the like; and no loop
// in it (over several keys, say) may return or break before it has looked at every element.
func ConstantTimeCompare(t testing.TB, file, fn string) {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, file, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var decl *ast.FuncDecl
	for _, d := range f.Decls {
		if fd, ok := d.(*ast.FuncDecl); ok && fd.Name.Name == fn {
			decl = fd
		}
	}
	if decl == nil {
		t.Fatalf("%s: no func %s", file, fn)
	}
	constantTime := false
	ast.Inspect(decl, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.ForStmt:
			noEarlyExit(t, fset, fn, n.Body)
		case *ast.RangeStmt:
			noEarlyExit(t, fset, fn, n.Body)
		case *ast.SelectorExpr:
			x, ok := n.X.(*ast.Ident)
			if !ok {
				return true
			}
			switch x.Name + "." + n.Sel.Name {
			case "subtle.ConstantTimeCompare":
				constantTime = true
			case "bytes.Equal", "bytes.Compare", "bytes.EqualFold", "strings.Compare", "strings.EqualFold",
				"reflect.DeepEqual", "slices.Equal":
				t.Errorf("%s: %s compares with %s.%s", fset.Position(n.Pos()), fn, x.Name, n.Sel.Name)
			}
		case *ast.BinaryExpr:
			if n.Op != token.EQL && n.Op != token.NEQ {
				return true
			}
			if lit, ok := n.Y.(*ast.BasicLit); ok && (lit.Kind == token.INT || lit.Value == `""`) {
				return true
			}
			t.Errorf("%s: %s compares with %s", fset.Position(n.Pos()), fn, n.Op)
		}
		return true
	})
	if !constantTime {
		t.Errorf("%s: %s does not use subtle.ConstantTimeCompare", file, fn)
	}
}

// noEarlyExit reports a return, break or goto inside a loop body (closures aside).
func noEarlyExit(t testing.TB, fset *token.FileSet, fn string, body *ast.BlockStmt) {
	t.Helper()
	ast.Inspect(body, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.FuncLit:
			return false
		case *ast.ReturnStmt:
			t.Errorf("%s: %s returns from inside a loop", fset.Position(n.Pos()), fn)
		case *ast.BranchStmt:
			if n.Tok == token.BREAK || n.Tok == token.GOTO {
				t.Errorf("%s: %s leaves a loop early (%s)", fset.Position(n.Pos()), fn, n.Tok)
			}
		}
		return true
	})
}
