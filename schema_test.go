package outbox

import (
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSchemaFilesAreTheStores: schema/ holds the DDL for teams that run
// their own migrations; each store embeds its own copy, which db.Use runs.
// They must be the same text.
func TestSchemaFilesAreTheStores(t *testing.T) {
	for published, embedded := range map[string]string{
		"schema/postgres.sql":           "internal/store/postgres/postgres.sql",
		"schema/postgres-upgrade-2.sql": "internal/store/postgres/postgres-upgrade-2.sql",
		"schema/sqlite.sql":             "internal/store/sqlite/sqlite.sql",
		"schema/sqlite-upgrade-2.sql":   "internal/store/sqlite/sqlite-upgrade-2.sql",
		"schema/mysql.sql":              "internal/store/mysql/mysql.sql",
		"schema/postgres-upgrade-3.sql": "internal/store/postgres/postgres-upgrade-3.sql",
		"schema/sqlite-upgrade-3.sql":   "internal/store/sqlite/sqlite-upgrade-3.sql",
		"schema/mysql-upgrade-3.sql":    "internal/store/mysql/mysql-upgrade-3.sql",
		"schema/postgres-inbox.sql":     "internal/store/postgres/postgres-inbox.sql",
		"schema/sqlite-inbox.sql":       "internal/store/sqlite/sqlite-inbox.sql",
		"schema/mysql-inbox.sql":        "internal/store/mysql/mysql-inbox.sql",
	} {
		a, err := os.ReadFile(published)
		require.NoError(t, err)
		b, err := os.ReadFile(embedded)
		require.NoError(t, err)
		assert.Equal(t, string(b), string(a), "%s differs from %s, which db.Use runs: copy it over", published, embedded)
	}
	files, err := os.ReadDir("schema")
	require.NoError(t, err)
	assert.Len(t, files, 11, "a new schema file needs its store's copy and a line above")
}
