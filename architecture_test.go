package outbox

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestImportRules holds the packages to the shape ARCHITECTURE.md draws:
// the root is the public face and may use every internal package; below
// it, each package may import only those listed for it (of this module's
// packages), so that the engine knows no source, no source knows another,
// and a store knows only the seam, the shared SQL and the stores it builds
// on. Every internal package must have a rule. Test files are not held to
// it.
func TestImportRules(t *testing.T) {
	const mod = "github.com/gorm-outbox/outbox/"
	allowed := map[string][]string{
		"internal/errs":            {},
		"internal/encode":          {},
		"internal/txhook":          {},
		"internal/store":           {"internal/errs"},
		"internal/store/sqlbuild":  {"internal/store"},
		"internal/store/storetest": {"internal/errs", "internal/store"},
		"internal/engine":          {"internal/errs", "internal/store"},
		"internal/wal":             {"internal/engine", "internal/errs", "internal/store"},
		"internal/maint":           {"internal/engine", "internal/store"},
		"internal/overview":        {"internal/store"},
		"internal/pgtest":          {},
		"internal/testenv":         {},
		"internal/outagetest":      {".", "outboxtest"}, // the public API, for the adapters' outage tests
	}
	// A store (internal/store/<database>) may build on another store.
	dirs, err := filepath.Glob("internal/store/*")
	require.NoError(t, err)
	var stores []string
	for _, d := range dirs {
		if fi, err := os.Stat(d); err == nil && fi.IsDir() && allowed[d] == nil {
			stores = append(stores, d)
		}
	}
	for _, d := range stores {
		allowed[d] = append([]string{"internal/errs", "internal/store", "internal/store/sqlbuild"}, slices.DeleteFunc(slices.Clone(stores), func(o string) bool { return o == d })...)
	}
	all, err := filepath.Glob("internal/*")
	require.NoError(t, err)
	all = append(all, dirs...)
	for _, d := range all {
		if fi, err := os.Stat(d); err == nil && fi.IsDir() {
			_, ok := allowed[d]
			assert.True(t, ok, "%s has no import rule: add it here and to ARCHITECTURE.md", d)
		}
	}
	for dir, may := range allowed {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		require.NoError(t, err)
		require.NotEmpty(t, files, dir)
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			src, err := os.ReadFile(f)
			require.NoError(t, err)
			ast, err := parser.ParseFile(token.NewFileSet(), f, src, parser.ImportsOnly)
			require.NoError(t, err)
			for _, imp := range ast.Imports {
				path, _ := strconv.Unquote(imp.Path.Value)
				if !strings.HasPrefix(path, mod) && path != strings.TrimSuffix(mod, "/") {
					continue
				}
				rel := strings.TrimPrefix(path, mod)
				if path == strings.TrimSuffix(mod, "/") {
					rel = "."
				}
				assert.True(t, slices.Contains(may, rel), "%s imports %s, which ARCHITECTURE.md does not allow it", f, path)
			}
		}
	}
}

// TestArchitectureRoles keeps ARCHITECTURE.md's table of the store's roles
// equal to the interfaces of internal/store/store.go: every role with its
// methods, no more, no fewer. DB (what a method runs on) and Lead (what
// InboxLead returns) are not roles.
func TestArchitectureRoles(t *testing.T) {
	src, err := os.ReadFile("internal/store/store.go")
	require.NoError(t, err)
	f, err := parser.ParseFile(token.NewFileSet(), "store.go", src, 0)
	require.NoError(t, err)
	code := map[string][]string{}
	for _, d := range f.Decls {
		gd, ok := d.(*ast.GenDecl)
		if !ok || gd.Tok != token.TYPE {
			continue
		}
		for _, sp := range gd.Specs {
			ts := sp.(*ast.TypeSpec)
			it, ok := ts.Type.(*ast.InterfaceType)
			if !ok || !ts.Name.IsExported() || ts.Name.Name == "DB" || ts.Name.Name == "Lead" {
				continue
			}
			var methods []string
			for _, m := range it.Methods.List {
				for _, n := range m.Names {
					methods = append(methods, n.Name)
				}
			}
			slices.Sort(methods)
			code[ts.Name.Name] = methods
		}
	}
	doc, err := os.ReadFile("ARCHITECTURE.md")
	require.NoError(t, err)
	row := regexp.MustCompile("(?m)^\\| `(\\w+)` \\| [^|]+ \\| (`\\w+`(?:, `\\w+`)*) \\|$")
	docs := map[string][]string{}
	for _, m := range row.FindAllStringSubmatch(string(doc), -1) {
		var methods []string
		for _, name := range strings.Split(m[2], ", ") {
			methods = append(methods, strings.Trim(name, "`"))
		}
		slices.Sort(methods)
		docs[m[1]] = methods
	}
	require.NotEmpty(t, docs, "ARCHITECTURE.md has no table of roles")
	assert.Equal(t, code, docs, "ARCHITECTURE.md's roles and their methods, against internal/store/store.go")
}

// TestBuildTagsLinkOnlyTheirStore: the root package links no other
// database's driver: MySQL's never unless its store is in (it reads the
// driver by reflection), pgx only with the PostgreSQL store, which the
// tags outbox_sqlite and outbox_mysql leave out (docs/databases.md,
// "Linking only your database").
func TestBuildTagsLinkOnlyTheirStore(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	t.Parallel()
	deps := func(tags string) string {
		out, err := exec.Command("go", "list", "-deps", "-tags", tags, ".").CombinedOutput()
		require.NoError(t, err, "%s", out)
		return string(out)
	}
	for _, c := range []struct {
		tags       string
		in, absent []string
	}{
		{"", []string{"github.com/jackc/pgx/v5", "internal/store/mysql", "internal/store/sqlite"}, []string{"github.com/go-sql-driver/mysql", "github.com/mattn/go-sqlite3"}},
		{"outbox_postgres", []string{"internal/store/postgres", "internal/wal"}, []string{"internal/store/mysql\n", "github.com/go-sql-driver/mysql"}},
		{"outbox_sqlite", []string{"internal/store/sqlite"}, []string{"github.com/jackc/", "internal/wal", "internal/store/postgres", "internal/store/mysql\n", "github.com/go-sql-driver/mysql"}},
		{"outbox_mysql", []string{"internal/store/mysql"}, []string{"github.com/jackc/", "internal/wal", "internal/store/postgres", "github.com/go-sql-driver/mysql"}},
	} {
		got := deps(c.tags)
		for _, p := range c.in {
			assert.Contains(t, got, p, "-tags %q links %s", c.tags, p)
		}
		for _, p := range c.absent {
			assert.NotContains(t, got, p, "-tags %q links no %s", c.tags, p)
		}
	}
}
