package outbox

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
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
// and a store knows only the store seam. Test files are not held to it.
func TestImportRules(t *testing.T) {
	const mod = "github.com/gorm-outbox/outbox/"
	allowed := map[string][]string{
		"internal/errs":            {},
		"internal/encode":          {},
		"internal/txhook":          {},
		"internal/store":           {"internal/errs"},
		"internal/store/sqlbuild":  {"internal/store"},
		"internal/store/postgres":  {"internal/errs", "internal/store", "internal/store/sqlbuild"},
		"internal/store/mysql":     {"internal/errs", "internal/store", "internal/store/sqlbuild"},
		"internal/store/sqlite":    {"internal/errs", "internal/store", "internal/store/sqlbuild"},
		"internal/store/storetest": {"internal/errs", "internal/store"},
		"internal/engine":          {"internal/errs", "internal/store"},
		"internal/wal":             {"internal/engine", "internal/errs", "internal/store"},
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
				assert.True(t, slices.Contains(may, rel), "%s imports %s, which ARCHITECTURE.md does not allow it", f, path)
			}
		}
	}
}
