package outbox

import "github.com/gorm-outbox/outbox/internal/store/sqlite"

// The settings concurrent writers and a relay need on one SQLite file: the
// WAL journal (readers never block the writer), a 10 s busy timeout (wait
// for the write lock rather than fail), and immediate transactions (take
// the write lock at BEGIN, so a transaction that reads first is not
// refused at its first write). db.Use logs a warning when they are missing.
const (
	// SQLiteDSNOptions spells them for gorm.io/driver/sqlite
	// (mattn/go-sqlite3, cgo):
	//
	//	gorm.Open(sqlite.Open("file:app.db"+outbox.SQLiteDSNOptions), cfg)
	SQLiteDSNOptions = sqlite.DSNOptions

	// SQLitePureGoDSNOptions spells them for the pure-Go drivers
	// (github.com/libtnb/sqlite, modernc.org/sqlite,
	// github.com/ncruces/go-sqlite3, github.com/glebarez/sqlite) with
	// _pragma, which they all read (all but modernc.org/sqlite since v1.55
	// ignore _journal_mode and _busy_timeout):
	//
	//	gorm.Open(sqlite.Open("file:app.db"+outbox.SQLitePureGoDSNOptions), cfg) // github.com/libtnb/sqlite
	SQLitePureGoDSNOptions = sqlite.PureGoDSNOptions
)
