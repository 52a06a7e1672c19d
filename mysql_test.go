package outbox

import "testing"

// TestMySQL runs the shared suite on MySQL or MariaDB. It needs
// OUTBOX_TEST_MYSQL_DSN; it skips when that is unset and fails when it is set
// but the server cannot be reached.
func TestMySQL(t *testing.T) {
	t.Parallel()
	runSuite(t, mysqlBackend(t))
}
