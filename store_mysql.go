//go:build outbox_mysql || !(outbox_postgres || outbox_sqlite)

package outbox

import (
	"github.com/gorm-outbox/outbox/internal/store"
	"github.com/gorm-outbox/outbox/internal/store/mysql"
)

// The MySQL/MariaDB store (see store_postgres.go for the build tags).
func init() { store.Register(mysql.Driver) }
