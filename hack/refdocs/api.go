package main

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// apiType is one named type of the API package: a struct with fields, or a scalar type (an enum, a
// pattern-checked string).
type apiType struct {
	name, doc string
	markers   []string
	fields    []*apiField // nil for scalar types
	scalar    string      // the underlying type of a scalar type
	pos       token.Position
	root      bool // a kind (+kubebuilder:object:root=true), not its List
	list      bool // a kind's List
}

// apiField is one field of a struct type.
type apiField struct {
	goName, json string
	doc          string
	shared       bool // doc is a preceding sibling's comment that names this field too
	markers      []string
	typ          ast.Expr
	inline       bool
	pos          token.Position
}

// apiConst is a constant of a named type (an enum value) with its comment.
type apiConst struct{ name, typ, value, doc string }

// apiPackage is what the reference is made of.
type apiPackage struct {
	doc    string
	types  map[string]*apiType
	order  []string // file order
	consts []apiConst
}

// loadAPI parses the non-test, non-generated Go files of dir.
func loadAPI(dir string) (*apiPackage, error) {
	fset := token.NewFileSet()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return nil, err
	}
	sort.Strings(files)
	p := &apiPackage{types: map[string]*apiType{}}
	for _, path := range files {
		base := filepath.Base(path)
		if strings.HasSuffix(base, "_test.go") || strings.HasPrefix(base, "zz_generated") {
			continue
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		f, err := parser.ParseFile(fset, path, src, parser.ParseComments)
		if err != nil {
			return nil, err
		}
		if f.Doc != nil && p.doc == "" {
			p.doc, _ = comment(f.Doc)
		}
		for _, d := range f.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok {
				continue
			}
			switch gd.Tok {
			case token.TYPE:
				for _, s := range gd.Specs {
					ts := s.(*ast.TypeSpec)
					if !ts.Name.IsExported() {
						continue
					}
					doc := ts.Doc
					if doc == nil && len(gd.Specs) == 1 {
						doc = gd.Doc
					}
					t := &apiType{name: ts.Name.Name, pos: fset.Position(ts.Pos())}
					t.doc, t.markers = comment(doc)
					if st, ok := ts.Type.(*ast.StructType); ok {
						t.fields = structFields(fset, st)
					} else {
						t.scalar = exprString(ts.Type)
					}
					if slices.Contains(t.markers, "+kubebuilder:object:root=true") {
						t.list = hasField(t, "ListMeta")
						t.root = !t.list
					}
					p.types[t.name] = t
					p.order = append(p.order, t.name)
				}
			case token.CONST:
				for _, s := range gd.Specs {
					vs := s.(*ast.ValueSpec)
					if vs.Type == nil || len(vs.Values) != 1 {
						continue
					}
					lit, ok := vs.Values[0].(*ast.BasicLit)
					if !ok || lit.Kind != token.STRING {
						continue
					}
					v, _ := strconv.Unquote(lit.Value)
					doc, _ := comment(vs.Doc)
					p.consts = append(p.consts, apiConst{name: vs.Names[0].Name, typ: exprString(vs.Type), value: v, doc: doc})
				}
			}
		}
	}
	return p, nil
}

func hasField(t *apiType, goType string) bool {
	for _, f := range t.fields {
		if f.goName == exprString(f.typ) && strings.HasSuffix(f.goName, goType) {
			return true
		}
	}
	return false
}

// structFields reads a struct's fields with their JSON names, comments and markers. A field without a
// comment of its own is documented by the nearest commented field before it when that comment names it
// ("policy and policyGeneration name ..."): the API's convention for fields that go together.
func structFields(fset *token.FileSet, st *ast.StructType) []*apiField {
	var out []*apiField
	var lastDoc string
	for _, fl := range st.Fields.List {
		f := &apiField{typ: fl.Type, pos: fset.Position(fl.Pos())}
		f.doc, f.markers = comment(fl.Doc)
		if fl.Tag != nil {
			tag, _ := strconv.Unquote(fl.Tag.Value)
			j := reflect.StructTag(tag).Get("json")
			name, opts, _ := strings.Cut(j, ",")
			f.json = name
			f.inline = strings.Contains(opts, "inline")
		}
		if len(fl.Names) > 0 {
			f.goName = fl.Names[0].Name
		} else {
			// An embedded struct is inlined unless its tag names it (metadata).
			f.goName = exprString(fl.Type)
			f.inline = f.inline || f.json == ""
		}
		if f.doc != "" {
			lastDoc = f.doc
		} else if f.json != "" && lastDoc != "" && namesWord(lastDoc, f.json) {
			f.doc, f.shared = lastDoc, true
		}
		out = append(out, f)
	}
	return out
}

func namesWord(text, word string) bool {
	return regexp.MustCompile(`(^|[^A-Za-z0-9_.])` + regexp.QuoteMeta(word) + `([^A-Za-z0-9_]|$)`).MatchString(text)
}

func exprString(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.Ident:
		return e.Name
	case *ast.StarExpr:
		return "*" + exprString(e.X)
	case *ast.ArrayType:
		return "[]" + exprString(e.Elt)
	case *ast.MapType:
		return "map[" + exprString(e.Key) + "]" + exprString(e.Value)
	case *ast.SelectorExpr:
		return exprString(e.X) + "." + e.Sel.Name
	}
	return fmt.Sprintf("%T", e)
}

// external are the types from other modules the API uses, with where a reader finds them. A type not
// listed here is a fault, so the reference never shows a type without somewhere to read about it.
var external = map[string]string{
	"metav1.Duration":    "[Duration](https://pkg.go.dev/k8s.io/apimachinery/pkg/apis/meta/v1#Duration) (a Go duration string: `10m`, `1h30m`)",
	"metav1.Time":        "[Time](https://pkg.go.dev/k8s.io/apimachinery/pkg/apis/meta/v1#Time) (RFC 3339)",
	"metav1.Condition":   "[Condition](https://pkg.go.dev/k8s.io/apimachinery/pkg/apis/meta/v1#Condition)",
	"resource.Quantity":  "[Quantity](https://pkg.go.dev/k8s.io/apimachinery/pkg/api/resource#Quantity)",
	"intstr.IntOrString": "[IntOrString](https://pkg.go.dev/k8s.io/apimachinery/pkg/util/intstr#IntOrString)",
	"metav1.ObjectMeta":  "[ObjectMeta](https://pkg.go.dev/k8s.io/apimachinery/pkg/apis/meta/v1#ObjectMeta)",
	"metav1.TypeMeta":    "",
	"metav1.ListMeta":    "",
	"string":             "string",
	"bool":               "boolean",
	"int32":              "integer (int32)",
	"int64":              "integer (int64)",
	"map[string]string":  "map of string to string",
}

// anchor is the heading anchor GitHub gives a type's heading.
func anchor(name string) string { return strings.ToLower(name) }
