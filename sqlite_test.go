package outbox

import "testing"

func TestSQLite(t *testing.T) {
	t.Parallel()
	runSuite(t, sqliteBackend)
}

// TestSQLitePureGo runs the shared suite on the pure-Go SQLite driver
// (github.com/libtnb/sqlite, modernc.org/sqlite): the cgo-free path.
func TestSQLitePureGo(t *testing.T) {
	t.Parallel()
	runSuite(t, pureSQLiteBackend)
}
