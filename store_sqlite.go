//go:build outbox_sqlite || !(outbox_postgres || outbox_mysql)

package outbox

import (
	"github.com/gorm-outbox/outbox/internal/store"
	"github.com/gorm-outbox/outbox/internal/store/sqlite"
)

// The SQLite store (see store_postgres.go for the build tags).
func init() { store.Register(sqlite.Driver) }
