package sqlite_test

import (
	"testing"

	"github.com/gorm-outbox/outbox/internal/errs"
	"github.com/gorm-outbox/outbox/internal/store/sqlite"
	"github.com/stretchr/testify/assert"
)

// TestCheckVersion: a SQLite library before 3.35 (no RETURNING) is refused
// with ErrUnsupportedVersion.
func TestCheckVersion(t *testing.T) {
	for _, v := range []string{"3.34.1", "3.8.0", "2.9.9"} {
		assert.ErrorIs(t, sqlite.CheckVersion(v), errs.ErrUnsupportedVersion, v)
	}
	for _, v := range []string{"3.35.0", "3.45.1", "3.50", "4.0.0"} {
		assert.NoError(t, sqlite.CheckVersion(v), v)
	}
}
