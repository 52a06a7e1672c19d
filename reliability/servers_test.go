package reliability

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	mysqldriver "github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"
	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

const mysqlDSNEnv = "OUTBOX_TEST_MYSQL_DSN"

// server is a client-server database the crash and fault tests run on:
// PostgreSQL or MySQL/MariaDB. Everything those tests do differently on
// them is here; the tests themselves are written once and run per server
// in subtests (forEachServer).
type server struct {
	name string
	// fresh returns the DSN of a schema (PostgreSQL) or database (MySQL)
	// of the test's own, dropped at its end. It skips the test when the
	// server's DSN variable is unset, and fails it when the variable is set
	// but the server is unreachable.
	fresh func(t testing.TB) string
	// open returns GORM's dialector for dsn.
	open func(dsn string) gorm.Dialector
	// addr returns the host:port dsn connects to; via returns dsn pointed
	// at another host:port (the fault proxy).
	addr func(t testing.TB, dsn string) string
	via  func(t testing.TB, dsn, hostport string) string
	// tagged returns a DSN for another process, derived from dsn, whose
	// sessions sessions(db, tag) counts: on PostgreSQL an application_name,
	// on MySQL a user of its own (which has no such name without the
	// performance schema), created through db and dropped at the end.
	tagged   func(t testing.TB, db *gorm.DB, dsn, tag string) string
	sessions func(db *gorm.DB, tag string) (int64, error)
	// crashDDL creates crash_orders and crash_deliveries.
	crashDDL []string
	// starts returns a predicate on the bytes a client sends, true when
	// they hold the wire message that begins step: the fault tests shut a
	// direction of the proxy right there.
	starts func(step wireStep) func(chunk []byte) bool
}

// wireStep names the round trips of the relay the fault tests cut.
type wireStep int

const (
	// claimCommit is the round trip whose arrival commits a claim:
	// PostgreSQL's single UPDATE ... RETURNING, MySQL's COMMIT after the
	// locking SELECT and the UPDATE.
	claimCommit wireStep = iota
	// outcomeExec is the execution of an outcome statement (the mark).
	outcomeExec
)

// servers returns the servers the crash and fault tests run on.
func servers() []server { return []server{postgresServer(), mysqlServer()} }

// serverNamed returns the server called name (for the crash child).
func serverNamed(name string) (server, bool) {
	for _, s := range servers() {
		if s.name == name {
			return s, true
		}
	}
	return server{}, false
}

// forEachServer runs f in a parallel subtest per server.
func forEachServer(t *testing.T, f func(t *testing.T, s server)) {
	t.Helper()
	for _, s := range servers() {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			f(t, s)
		})
	}
}

func postgresServer() server {
	return server{
		name:  "postgres",
		fresh: postgresSchema,
		open:  postgres.Open,
		addr: func(t testing.TB, dsn string) string {
			u := parseURLDSN(t, dsn)
			if u.Port() == "" {
				return u.Host + ":5432"
			}
			return u.Host
		},
		via: func(t testing.TB, dsn, hostport string) string {
			u := parseURLDSN(t, dsn)
			u.Host = hostport
			return u.String()
		},
		tagged: func(t testing.TB, _ *gorm.DB, dsn, tag string) string {
			return withParam(t, dsn, "application_name", tag)
		},
		sessions: func(db *gorm.DB, tag string) (int64, error) {
			var n int64
			err := db.Raw(`SELECT count(*) FROM pg_stat_activity WHERE application_name = ?`, tag).Scan(&n).Error
			return n, err
		},
		crashDDL: []string{
			`CREATE TABLE crash_orders (id text PRIMARY KEY, event_id text NOT NULL, round integer NOT NULL)`,
			`CREATE TABLE crash_deliveries (seq bigserial PRIMARY KEY, event_id text NOT NULL, round integer NOT NULL,
    delivered_at timestamptz NOT NULL DEFAULT now())`,
			`CREATE INDEX crash_deliveries_event ON crash_deliveries (event_id)`,
		},
		// pgx runs every statement with arguments as Bind, Execute, Sync
		// (after a Parse the first time): a claim or a mark is one Bind.
		// Its liveness ping is a simple Query, which passes. A claim is the
		// second statement of its cycle: the first reads the table from
		// the relay's watermark (a relay's first cycle also sweeps, which
		// warmUp has done).
		starts: func(step wireStep) func([]byte) bool {
			if step == claimCommit {
				return nthMatch(2, pgMessage('B'))
			}
			return pgMessage('B')
		},
	}
}

func parseURLDSN(t testing.TB, dsn string) *url.URL {
	t.Helper()
	u, err := url.Parse(dsn)
	require.NoError(t, err, "%s must be a URL (postgres://...)", postgresDSNEnv)
	require.NotEmpty(t, u.Host, "%s must name a TCP host:port for the fault proxy", postgresDSNEnv)
	return u
}

// pgMessage reports whether a chunk of PostgreSQL frontend messages holds
// one of type typ. Every message after the startup is a type byte and a
// 4-byte length that counts itself; a chunk that does not begin on a
// message boundary is not recognised.
// nthMatch matches the n-th chunk match matches.
func nthMatch(n int, match func([]byte) bool) func([]byte) bool {
	var seen atomic.Int64
	return func(chunk []byte) bool {
		return match(chunk) && seen.Add(1) == int64(n)
	}
}

func pgMessage(typ byte) func([]byte) bool {
	return func(chunk []byte) bool {
		for len(chunk) >= 5 {
			if chunk[0] == typ {
				return true
			}
			n := int(binary.BigEndian.Uint32(chunk[1:5]))
			if n < 4 || 1+n > len(chunk) {
				return false
			}
			chunk = chunk[1+n:]
		}
		return false
	}
}

// MySQL client commands (the first byte of a command packet).
const (
	mysqlComQuery       = 0x03
	mysqlComStmtExecute = 0x17
)

// mysqlCommand reports whether a chunk of MySQL client packets holds a
// command cmd whose payload begins with prefix. A packet is a 3-byte
// little-endian length, a sequence number (0 for a command) and the
// payload; a chunk that does not begin on a packet boundary is not
// recognised.
func mysqlCommand(cmd byte, prefix string) func([]byte) bool {
	return func(chunk []byte) bool {
		for len(chunk) >= 5 {
			n := int(chunk[0]) | int(chunk[1])<<8 | int(chunk[2])<<16
			if chunk[3] == 0 && chunk[4] == cmd && strings.HasPrefix(string(chunk[5:min(len(chunk), 4+n)]), prefix) {
				return true
			}
			if 4+n > len(chunk) {
				return false
			}
			chunk = chunk[4+n:]
		}
		return false
	}
}

func mysqlServer() server {
	return server{
		name:  "mysql",
		fresh: mysqlDatabase,
		open:  mysql.Open,
		addr: func(t testing.TB, dsn string) string {
			cfg := parseMySQLDSN(t, dsn)
			require.Equal(t, "tcp", cfg.Net, "%s must name a TCP host:port for the fault proxy", mysqlDSNEnv)
			return cfg.Addr
		},
		via: func(t testing.TB, dsn, hostport string) string {
			cfg := parseMySQLDSN(t, dsn)
			cfg.Net, cfg.Addr = "tcp", hostport
			return cfg.FormatDSN()
		},
		tagged:   mysqlUser,
		sessions: mysqlSessions,
		// The outbox table's charset and collation, so that its IDs and
		// these columns compare without a collation mix.
		crashDDL: []string{
			`CREATE TABLE crash_orders (id VARCHAR(255) NOT NULL PRIMARY KEY, event_id VARCHAR(255) NOT NULL, round INT NOT NULL,
    INDEX crash_orders_event (event_id)) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin`,
			`CREATE TABLE crash_deliveries (seq BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY, event_id VARCHAR(255) NOT NULL, round INT NOT NULL,
    delivered_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6), INDEX crash_deliveries_event (event_id))
    ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin`,
		},
		// go-sql-driver prepares every statement with arguments (COM_STMT_
		// PREPARE, then COM_STMT_EXECUTE, then COM_STMT_CLOSE), and the
		// claim is a transaction: it is committed by its COMMIT, a query.
		starts: func(step wireStep) func([]byte) bool {
			if step == claimCommit {
				return mysqlCommand(mysqlComQuery, "COMMIT")
			}
			return mysqlCommand(mysqlComStmtExecute, "")
		},
	}
}

func parseMySQLDSN(t testing.TB, dsn string) *mysqldriver.Config {
	t.Helper()
	cfg, err := mysqldriver.ParseDSN(dsn)
	require.NoError(t, err, "%s", mysqlDSNEnv)
	return cfg
}

// mysqlDatabase creates a database of the test's own, dropped at its end,
// and returns OUTBOX_TEST_MYSQL_DSN pointed at it.
func mysqlDatabase(t testing.TB) string {
	t.Helper()
	dsn := os.Getenv(mysqlDSNEnv)
	if dsn == "" {
		noteSkip(mysqlDSNEnv+" is not set", t.Name())
		t.Skipf("%s is not set; set it (e.g. root@tcp(127.0.0.1:3306)/test?charset=utf8mb4&parseTime=True&loc=Local) to run the MySQL/MariaDB reliability tests", mysqlDSNEnv)
	}
	cfg := parseMySQLDSN(t, dsn)
	// GORM's MySQL dialector asks the server's version as it opens.
	admin, err := gorm.Open(mysql.Open(dsn), &gorm.Config{Logger: logger.Discard})
	require.NoError(t, err, "%s is set but MySQL is unreachable", mysqlDSNEnv)
	sqlDB, err := admin.DB()
	require.NoError(t, err)
	t.Cleanup(func() { _ = sqlDB.Close() })
	require.NoError(t, sqlDB.Ping(), "%s is set but MySQL is unreachable", mysqlDSNEnv)

	name := "t_" + randomHex(6)
	require.NoError(t, admin.Exec("CREATE DATABASE "+name+" CHARACTER SET utf8mb4 COLLATE utf8mb4_bin").Error)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = admin.WithContext(ctx).Exec("DROP DATABASE " + name).Error
	})
	cfg.DBName = name
	return cfg.FormatDSN()
}

// mysqlUser creates the user tag (at the host the server sees db's own
// user connect from), with every privilege on dsn's database, dropped at
// the end of the test, and returns dsn logging in as it.
func mysqlUser(t testing.TB, db *gorm.DB, dsn, tag string) string {
	t.Helper()
	cfg := parseMySQLDSN(t, dsn)
	var current string
	require.NoError(t, db.Raw("SELECT CURRENT_USER()").Scan(&current).Error)
	host := current[strings.LastIndexByte(current, '@')+1:]
	account := fmt.Sprintf("'%s'@'%s'", tag, host)
	password := randomHex(12)
	require.NoError(t, db.Exec("CREATE USER "+account+" IDENTIFIED BY '"+password+"'").Error,
		"the crash test needs a user per child process (MySQL names sessions by user only); %s's user must be allowed CREATE USER", mysqlDSNEnv)
	t.Cleanup(func() { _ = db.Exec("DROP USER IF EXISTS " + account).Error })
	require.NoError(t, db.Exec("GRANT ALL PRIVILEGES ON `"+cfg.DBName+"`.* TO "+account).Error)
	cfg.User, cfg.Passwd = tag, password
	return cfg.FormatDSN()
}

func mysqlSessions(db *gorm.DB, user string) (int64, error) {
	var n int64
	err := db.Raw(`SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE USER = ?`, user).Scan(&n).Error
	return n, err
}
