package warren_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"regexp"
	"strings"
	"testing"
)

// Tests of the library's source (options.go and the declarations the documentation groups): go
// doc lists every option constructor under its type, reasons are typed, and comments cite no
// outside requirement ids.

// parsePackage parses the library's own source files (not its tests), with comments.
func parsePackage(t *testing.T) (*token.FileSet, []*ast.File) {
	t.Helper()
	fset := token.NewFileSet()
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	var files []*ast.File
	for _, e := range entries {
		name := e.Name()
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	return fset, files
}

// TestOptionConstructorsReturnNamedTypes: go doc lists a constructor under the type it returns,
// so an option constructor that returned an anonymous interface (as AutoAck, Durable, AutoDelete
// and Arguments once did) was listed under none, and `go doc ConsumeOption` did not show it.
// Every exported function returns named types.
func TestOptionConstructorsReturnNamedTypes(t *testing.T) {
	fset, files := parsePackage(t)
	for _, f := range files {
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Recv != nil || !fn.Name.IsExported() || fn.Type.Results == nil {
				continue
			}
			for _, r := range fn.Type.Results.List {
				if _, anon := r.Type.(*ast.InterfaceType); anon {
					t.Errorf("%s: %s returns an anonymous interface: go doc lists it under no type", fset.Position(fn.Pos()), fn.Name.Name)
				}
			}
		}
	}
}

// TestReasonsAreTyped: event and x-death reasons are constants of the named type Reason, so that
// go doc groups them and a reason is not mistaken for any string.
func TestReasonsAreTyped(t *testing.T) {
	fset, files := parsePackage(t)
	n := 0
	for _, f := range files {
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.CONST {
				continue
			}
			for _, spec := range g.Specs {
				v := spec.(*ast.ValueSpec)
				for _, name := range v.Names {
					if !strings.HasPrefix(name.Name, "Reason") && !strings.HasPrefix(name.Name, "Alert") ||
						name.Name == "Alert" { // Alert is a policy
						continue
					}
					n++
					if id, ok := v.Type.(*ast.Ident); !ok || id.Name != "Reason" {
						t.Errorf("%s: const %s is not of type Reason", fset.Position(name.Pos()), name.Name)
					}
				}
			}
		}
	}
	if n < 20 {
		t.Errorf("found %d reason constants, want the package's 20 or more", n)
	}
}

// TestCommentsCiteNoOutsideIDs: comments in the library cite no requirement ids (R1.10,
// Q8.4, R4.1-R4.3) of a document that is not in the repository: they say what the rule is.
func TestCommentsCiteNoOutsideIDs(t *testing.T) {
	fset, files := parsePackage(t)
	id := regexp.MustCompile(`\b[RQ][0-9]+\.[0-9]+\b`)
	for _, f := range files {
		for _, g := range f.Comments {
			for _, c := range g.List {
				if m := id.FindString(c.Text); m != "" {
					t.Errorf("%s: comment cites %s: %s", fset.Position(c.Pos()), m, c.Text)
				}
			}
		}
	}
}
