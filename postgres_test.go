package outbox

import "testing"

// TestPostgres runs the shared suite on PostgreSQL. It needs
// OUTBOX_TEST_POSTGRES_DSN; it skips when that is unset and fails when it is
// set but the server cannot be reached.
func TestPostgres(t *testing.T) {
	t.Parallel()
	runSuite(t, postgresBackend(t))
}
