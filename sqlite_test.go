package outbox

import "testing"

func TestSQLite(t *testing.T) {
	t.Parallel()
	runSuite(t, sqliteBackend)
}
