package storetest

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestDecidesNothingByName: the suite decides nothing by a store's name,
// so that adding a database needs no change to it (what differs between
// databases is in the DB a store's test opens). Its files compare no
// Name() with anything (==, !=, a switch), index nothing by it, and spell
// no store's name (a folder of internal/store) as a string of their own.
func TestDecidesNothingByName(t *testing.T) {
	dirs, err := os.ReadDir("..")
	require.NoError(t, err)
	stores := map[string]bool{}
	for _, d := range dirs {
		if d.IsDir() {
			stores[d.Name()] = true
		}
	}
	delete(stores, "storetest") // the suite itself
	require.NotEmpty(t, stores)
	files, err := filepath.Glob("*.go")
	require.NoError(t, err)
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		fset := token.NewFileSet()
		file, err := parser.ParseFile(fset, f, nil, 0)
		require.NoError(t, err)
		ast.Inspect(file, func(n ast.Node) bool {
			var by ast.Expr
			switch n := n.(type) {
			case *ast.BinaryExpr:
				if n.Op == token.EQL || n.Op == token.NEQ {
					if isNameCall(n.X) {
						by = n.X
					} else if isNameCall(n.Y) {
						by = n.Y
					}
				}
			case *ast.SwitchStmt:
				if isNameCall(n.Tag) {
					by = n.Tag
				}
			case *ast.IndexExpr:
				if isNameCall(n.Index) {
					by = n.Index
				}
			case *ast.BasicLit:
				if s, err := strconv.Unquote(n.Value); err == nil && n.Kind == token.STRING && stores[s] {
					t.Errorf("%s: the suite spells the store name %q: what differs goes in the DB the store's test opens", fset.Position(n.Pos()), s)
				}
			}
			if by != nil {
				t.Errorf("%s: the suite decides by a Name(): what differs goes in the DB the store's test opens", fset.Position(by.Pos()))
			}
			return true
		})
	}
}

// isNameCall reports whether e is a call x.Name() without arguments.
func isNameCall(e ast.Expr) bool {
	c, ok := e.(*ast.CallExpr)
	if !ok || len(c.Args) > 0 {
		return false
	}
	sel, ok := c.Fun.(*ast.SelectorExpr)
	return ok && sel.Sel.Name == "Name"
}
