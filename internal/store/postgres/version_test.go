package postgres_test

import (
	"testing"

	"github.com/gorm-outbox/outbox/internal/errs"
	"github.com/gorm-outbox/outbox/internal/store/postgres"
	"github.com/stretchr/testify/assert"
)

// TestCheckVersion: a server before PostgreSQL 13 is refused with
// ErrUnsupportedVersion, naming the version.
func TestCheckVersion(t *testing.T) {
	for _, v := range []int{120022, 110000, 90600} {
		err := postgres.CheckVersion(v)
		assert.ErrorIs(t, err, errs.ErrUnsupportedVersion, "%d", v)
	}
	assert.ErrorContains(t, postgres.CheckVersion(120022), "PostgreSQL 12.22")
	for _, v := range []int{130000, 150019, 170002} {
		assert.NoError(t, postgres.CheckVersion(v), "%d", v)
	}
}
