// Package mysql is the outbox's store on MySQL 8.0.1+ and MariaDB 10.6+
// (gorm.io/driver/mysql names both "mysql").
package mysql

import (
	"context"
	"database/sql"
	"database/sql/driver"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/gorm-outbox/outbox/internal/errs"
	"github.com/gorm-outbox/outbox/internal/store"
	"github.com/gorm-outbox/outbox/internal/store/sqlbuild"
	"gorm.io/gorm"
)

var (
	//go:embed mysql.sql
	schema string
	//go:embed mysql-upgrade-3.sql
	upgrade3 string
	//go:embed mysql-inbox.sql
	inbox string
)

// Driver registers the store (the root package's registration line).
var Driver = store.Driver{
	Name:  "mysql",
	Probe: func(_ context.Context, dialector string, _ *sql.DB) bool { return dialector == "mysql" },
	Open:  func(table string) store.Store { return New(table) },
}

// Store serves MySQL 8.0.1+ and MariaDB 10.6+. Neither has UPDATE ... RETURNING (MariaDB only from
// 13), so the claim is a short transaction: SELECT ... FOR UPDATE SKIP
// LOCKED, then UPDATE the rows it locked. There are no partial indexes, no
// arrays and no numbered placeholders.
//
// Times go to the server as UTC text and come back as text (CAST ... AS
// CHAR): the driver would otherwise shift DATETIME values by the DSN's
// loc, and the server's time_zone never applies to DATETIME. So due times,
// leases and OccurredAt are right whatever loc and time_zone are.
type Store struct {
	sqlbuild.Syntax
	name    string
	mariadb atomic.Bool // learnt by check
}

var (
	_ store.Store     = (*Store)(nil)
	_ store.Inbox     = (*Store)(nil)
	_ store.InboxLead = (*Store)(nil)
	_ store.Overview  = (*Store)(nil)
	_ store.History   = (*Store)(nil)
	_ store.Relays    = (*Store)(nil)
)

// New returns the store of the table named table.
func New(table string) *Store {
	return &Store{name: table, Syntax: sqlbuild.Syntax{
		Table:       "`" + table + "`",
		Placeholder: sqlbuild.Question,
		TimeArg:     Time,
		TimeCol:     func(col string) string { return "CAST(" + col + " AS CHAR)" },
		// IN, not <>: two equality ranges of the ordering index, which
		// holds sent rows too.
		Unsent: "p.status IN ('pending', 'failed')",
		// MariaDB has no BIN_TO_UUID.
		IDCol: "COALESCE(named_id, LOWER(CONCAT_WS('-', HEX(SUBSTR(id, 1, 4)), HEX(SUBSTR(id, 5, 2)), HEX(SUBSTR(id, 7, 2))," +
			" HEX(SUBSTR(id, 9, 2)), HEX(SUBSTR(id, 11, 6)))))",
		IDArg:     func(u uuid.UUID) any { return u[:] },
		StatusArg: func(ph string) string { return ph },
		// MySQL takes 65535 parameters a statement; an INSERT row has 11,
		// an outcome row 4.
		Lim: store.Limits{MaxParams: 65535, InsertRows: 1000, OutcomeRows: 1000, RetentionBatch: 1000},
		// ON DUPLICATE KEY UPDATE, not INSERT IGNORE, which would also
		// turn truncation and other errors into warnings. MySQL has no
		// INSERT ... RETURNING: the rows of one INSERT without a conflict
		// clause get consecutive seqs (a "simple insert" at every
		// innodb_autoinc_lock_mode).
		InsertConflict: " ON DUPLICATE KEY UPDATE seq = seq",
		Lock:           sqlbuild.SkipLocked,
		Snapshot:       true,
		Dialect: sqlbuild.Dialect{
			MinuteOf:      func(col string) string { return "TIMESTAMPDIFF(MINUTE, '1970-01-01 00:00:00', " + col + ")" },
			MillisBetween: func(a, b string) string { return "TIMESTAMPDIFF(MICROSECOND, " + a + ", " + b + ") / 1000.0" },
			IntDiv:        "DIV",
			// MarkSent sets available_at to sent_at, so that the pending
			// index (status, available_at, seq) finds the rows sent in a
			// time range: there is no partial index of sent rows.
			SentRange: "available_at",
			AddOnConflict: func(_ string, _, cols []string) string {
				set := make([]string, len(cols))
				for i, c := range cols {
					set[i] = c + " = " + c + " + VALUES(" + c + ")"
				}
				return " ON DUPLICATE KEY UPDATE " + strings.Join(set, ", ")
			},
			InsertIgnore: [2]string{"INSERT IGNORE INTO", ""},
			Upsert: func(_ string, cols []string) string {
				set := make([]string, len(cols))
				for i, c := range cols {
					set[i] = c + " = VALUES(" + c + ")"
				}
				return " ON DUPLICATE KEY UPDATE " + strings.Join(set, ", ")
			},
			LimitedDelete: true,
		},
	}}
}

// Name implements store.Store.
func (d *Store) Name() string { return "mysql" }

// timeFormat is DATETIME(6)'s literal form.
const timeFormat = "2006-01-02 15:04:05.000000"

// Time is a time as MySQL takes it: UTC text.
func Time(t time.Time) any { return t.UTC().Format(timeFormat) }

// Schema implements store.Schema.
func (d *Store) Schema() string { return store.Rename(schema, d.name) }

// InboxSchema implements store.Inbox.
func (d *Store) InboxSchema(table string) string { return store.RenameInbox(inbox, table) }

// Record implements store.Inbox with INSERT IGNORE, whose affected-rows
// count is 0 for a duplicate whatever the connection's clientFoundRows (ON
// DUPLICATE KEY UPDATE would count a duplicate as found). What else IGNORE
// would turn into a warning, a too-long value, Consume refuses before. The
// duplicate-key check waits for a concurrent insert of the pair to end.
//
// Its values are literals, not arguments: without interpolateParams in the
// DSN the driver sends a statement with arguments as a prepared statement,
// two round trips (prepare, execute) where a text without arguments takes
// one.
func (d *Store) Record(ctx context.Context, db store.DB, table, consumer, messageID string, now time.Time) (bool, error) {
	return d.Recorded(ctx, db, sqlbuild.Query{SQL: consumeRow(table, consumer, messageID, now)})
}

// MigrateInbox implements store.Inbox.
func (d *Store) MigrateInbox(ctx context.Context, db *sql.DB, table string) error {
	return store.CreateDDL(ctx, db, d.Exists, d.InboxSchema(table))
}

func consumeRow(table, consumer, messageID string, now time.Time) string {
	at := "'" + now.UTC().Format(timeFormat) + "'"
	return sqlbuild.InboxRow("INSERT IGNORE INTO", "`"+table+"`", "", literal(consumer), literal(messageID), at)
}

// literal is s as a hexadecimal string literal in utf8mb4: no character
// of s can end it, whatever the connection's sql_mode says of backslashes.
func literal(s string) string { return "_utf8mb4 X'" + hex.EncodeToString([]byte(s)) + "'" }

// RetryRecord implements store.InboxRetrier: deliveries of one message
// that waited on one that rolled back all hold a shared lock on the key
// from their duplicate check and then wait on one another's to insert it;
// InnoDB ends all but one in a deadlock (1213), which rolls their
// transactions back, so they may run again (and find the pair recorded).
func (d *Store) RetryRecord(err error) bool {
	return isError(err, 1213)
}

// RecordLead implements store.InboxLead: one text of two statements.
func (d *Store) RecordLead(table, consumer, messageID string, now time.Time) store.Lead {
	return textLead("START TRANSACTION; " + consumeRow(table, consumer, messageID, now))
}

// textLead begins a transaction with a text of two statements, which
// MySQL's driver runs in one round trip with multiStatements.
type textLead string

// Begin implements store.Lead.
func (l textLead) Begin(ctx context.Context, conn *sql.Conn) (int64, error) {
	res, err := conn.ExecContext(ctx, string(l))
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// End implements store.Lead, on the driver's connection: database/sql
// knows no transaction on it.
func (l textLead) End(ctx context.Context, conn *sql.Conn, commit bool) (reuse bool, err error) {
	verb := "ROLLBACK"
	if commit {
		verb = "COMMIT"
	}
	rawErr := conn.Raw(func(dc any) error {
		ex, ok := dc.(driver.ExecerContext)
		if !ok {
			err = fmt.Errorf("outbox: the driver connection %T cannot run %s", dc, verb)
			return nil
		}
		_, err = ex.ExecContext(ctx, verb, nil)
		reuse = err == nil
		return nil
	})
	if err == nil {
		err = rawErr
	}
	return reuse, err
}

// CanLead implements store.InboxLead: the server runs a text of several
// statements only on a connection that asked for it (multiStatements=true
// in the DSN); otherwise it refuses the text as a syntax error (1064),
// having run none of it.
func (d *Store) CanLead(ctx context.Context, db *sql.DB) (bool, error) {
	if !isDriver(db.Driver()) {
		return false, nil
	}
	_, err := db.ExecContext(ctx, "DO 1; DO 1")
	switch {
	case err == nil:
		return true, nil
	case isError(err, 1064):
		return false, nil
	}
	return false, err
}

// ForgetConsumed implements store.Inbox: MySQL's DELETE takes ORDER BY and
// LIMIT (and refuses a subquery on the table it deletes from).
func (d *Store) ForgetConsumed(ctx context.Context, db store.DB, table string, before time.Time, limit int) (int64, error) {
	b := d.Build()
	return d.Exec(ctx, db, b.W("DELETE FROM `", table, "` WHERE consumed_at < ", b.Time(before), " ORDER BY consumed_at LIMIT ", b.Limit(limit)).Query())
}

// Exists implements store.Schema.
func (d *Store) Exists(ctx context.Context, db store.DB, name string) (bool, error) {
	var n int
	err := db.QueryRowContext(ctx, "SELECT (SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = ?)"+
		" + (SELECT COUNT(*) FROM information_schema.statistics WHERE table_schema = DATABASE() AND table_name = ? AND index_name = ?)",
		name, d.name, name).Scan(&n)
	return n > 0, err
}

// Version implements store.Schema.
func (d *Store) Version(ctx context.Context, db store.DB) (int, error) {
	var table, seq, named int
	err := db.QueryRowContext(ctx, "SELECT (SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = ?),"+
		" (SELECT COUNT(*) FROM information_schema.columns WHERE table_schema = DATABASE() AND table_name = ? AND column_name = 'seq'),"+
		" (SELECT COUNT(*) FROM information_schema.columns WHERE table_schema = DATABASE() AND table_name = ? AND column_name = 'named_id')",
		d.name, d.name, d.name).Scan(&table, &seq, &named)
	return store.VersionOf(table > 0, seq > 0, named > 0), err
}

// Migrate implements store.Store: MySQL commits each ALTER TABLE by
// itself, so the upgrade script's lock is a named lock the session holds
// (GET_LOCK), released by its last statement.
func (d *Store) Migrate(ctx context.Context, db *sql.DB) error {
	return store.Migrate(ctx, db, d, store.SessionLock)
}

// Upgrade implements store.Schema: no release created a version 1 table on
// MySQL.
func (d *Store) Upgrade(from int) string {
	if from == 2 {
		return store.Rename(upgrade3, d.name)
	}
	return ""
}

// claimRetries bounds how often a claim that lost a deadlock or a lock wait
// is tried again before the relay treats it as a failed cycle.
const claimRetries = 5

// Claim implements store.Claimer, retrying a claim that lost a race.
func (d *Store) Claim(ctx context.Context, db *sql.DB, c store.ClaimSpec) ([]store.Claimed, error) {
	return d.claim(ctx, db, c, "")
}

// claim is Claim with the scan held at its first row until gate, a named
// lock (GET_LOCK) that a test holds, is released: how a test lets other
// sessions commit while the scan runs, for as long as it needs on a
// loaded machine ("" in use).
func (d *Store) claim(ctx context.Context, db *sql.DB, c store.ClaimSpec, gate string) ([]store.Claimed, error) {
	for attempt := 1; ; attempt++ {
		batch, err := d.claimTx(ctx, db, c, gate)
		if err == nil || attempt == claimRetries || !retryable(err) || ctx.Err() != nil {
			return batch, err
		}
	}
}

// claimTx runs the claim at READ COMMITTED whatever the session's default:
// under REPEATABLE READ the locking read's gap locks deadlock concurrent
// business INSERTs (2,587 deadlocks in 8 s with 4 claimers and 8 writers,
// measured on MariaDB 10.11; none at READ COMMITTED).
func (d *Store) claimTx(ctx context.Context, db *sql.DB, c store.ClaimSpec, gate string) ([]store.Claimed, error) {
	tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return nil, err
	}
	defer func() { _ = tx.Rollback() }() // after Commit: a no-op

	batch, err := d.QueryClaimed(ctx, tx, d.selectDue(c, gate), c.Limit)
	if err == nil && c.Ordered && len(batch) > 0 {
		batch, err = d.dropOvertaking(ctx, tx, batch)
	}
	if err != nil || len(batch) == 0 {
		return nil, errors.Join(err, tx.Commit())
	}
	seqs := make([]int64, len(batch))
	for i := range batch {
		seqs[i] = batch[i].Seq
		batch[i].Attempts++
	}
	u := d.Build()
	u.W("UPDATE ", d.Table, " SET locked_until = ", u.Time(c.Lease),
		", attempts = attempts + 1 WHERE ", u.Seqs("seq", seqs))
	if _, err := d.Exec(ctx, tx, u.Query()); err != nil {
		return nil, err
	}
	if err := tx.Commit(); err != nil {
		return nil, err
	}
	return batch, nil
}

// SelectDue locks the due rows a claim takes, ordered by the index's own
// columns: ordering by id alone makes the server sort, and lock every row
// it scanned.
func (d *Store) SelectDue(c store.ClaimSpec) sqlbuild.Query { return d.selectDue(c, "") }

func (d *Store) selectDue(c store.ClaimSpec, gate string) sqlbuild.Query {
	b := d.Build()
	b.W("SELECT ", d.ClaimColumns(), " FROM ", d.Table, " c WHERE c.available_at <= ", b.Time(c.Now), " AND ")
	d.Due(b, c)
	if len(c.Seqs) > 0 {
		b.W(" AND ", b.Seqs("c.seq", c.Seqs))
	}
	if gate != "" {
		// Evaluated for each row the scan passes; the session keeps the
		// lock once it has it, so only the first row waits.
		b.W(" AND GET_LOCK(", b.Arg(gate), ", 60) = 1")
	}
	b.W(" ORDER BY c.available_at, c.seq LIMIT ", b.Limit(c.Limit), sqlbuild.SkipLocked)
	return b.Query()
}

// dropOvertaking removes from a batch locked for OrderByAggregate the rows
// an older unsent event of their aggregate precedes. The locking scan
// sees rows committed while it ran, but the predecessor probe inside it
// is a consistent read of the snapshot taken when the statement began: a
// transaction that commits events n and n+1 of one aggregate mid-scan has
// both locked, each with no predecessor in that snapshot. This second
// statement reads a snapshot of its own, taken after the scan, which holds
// every row the scan saw. The rows it drops stay locked, unleased, until
// the claim commits.
func (d *Store) dropOvertaking(ctx context.Context, tx *sql.Tx, batch []store.Claimed) ([]store.Claimed, error) {
	seqs := make([]int64, len(batch))
	for i := range batch {
		seqs[i] = batch[i].Seq
	}
	behind := map[int64]bool{}
	err := d.Each(ctx, tx, d.Overtaking(seqs), func(rows *sql.Rows) error {
		var seq int64
		if err := rows.Scan(&seq); err != nil {
			return err
		}
		behind[seq] = true
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(behind) == 0 {
		return batch, nil
	}
	return slices.DeleteFunc(batch, func(c store.Claimed) bool { return behind[c.Seq] }), nil
}

// Overtaking selects, among the rows with the given seqs, those an older
// unsent event of their aggregate precedes: by primary key, then one probe
// of the ordering index each, which holds no sent rows in the ranges read.
func (d *Store) Overtaking(seqs []int64) sqlbuild.Query {
	b := d.Build()
	ph := make([]string, len(seqs))
	for i, s := range seqs {
		ph[i] = b.Arg(s)
	}
	return b.W("SELECT c.seq FROM ", d.Table, " c WHERE c.seq IN (", strings.Join(ph, ", "), ") AND c.aggregate_id <> ''",
		" AND EXISTS (SELECT 1 FROM ", d.Table, " p WHERE p.aggregate_type = c.aggregate_type AND p.aggregate_id = c.aggregate_id",
		" AND ", d.Unsent, " AND p.seq < c.seq)").Query()
}

// retryable reports a deadlock (1213) or a lock wait timeout (1205):
// the statement lost a race and can simply run again.
func retryable(err error) bool {
	return isError(err, 1213, 1205)
}

// MarkFailed joins the outcomes as a derived table: MySQL has neither
// UPDATE ... FROM nor a VALUES list with column names.
func (d *Store) MarkFailed(ctx context.Context, db store.DB, outs []store.Outcome, now, lease time.Time) (int64, error) {
	return d.ExecChunks(ctx, db, len(outs), d.FailedChunk(), func(i, j int) sqlbuild.Query { return d.markFailed(outs[i:j], now, lease) })
}

func (d *Store) markFailed(outs []store.Outcome, now, lease time.Time) sqlbuild.Query {
	b := d.Build()
	b.W("UPDATE ", d.Table, " AS o JOIN (")
	for i, o := range outs {
		if i == 0 {
			b.W("SELECT ", b.Arg(o.Seq), " AS seq, ", b.Arg(o.Status), " AS status, ", b.Arg(o.Err), " AS err, ", b.Time(o.Due), " AS due")
			continue
		}
		b.W(" UNION ALL SELECT ", b.Arg(o.Seq), ", ", b.Arg(o.Status), ", ", b.Arg(o.Err), ", ", b.Time(o.Due))
	}
	b.W(") AS v ON o.seq = v.seq SET o.status = v.status, o.last_error = v.err, o.available_at = v.due,",
		" o.locked_until = NULL, o.updated_at = ", b.Time(now),
		" WHERE o.locked_until = ", b.Time(lease), " AND o.status = 'pending'")
	return b.Query()
}

// DeleteSent orders and limits the DELETE itself (MySQL refuses LIMIT in
// an IN subquery) and reads the sent rows through the pending index, the
// one the table has: a row was due before it was sent (available_at <=
// sent_at), so the range (sent, available_at < before) holds every row to
// delete and few others, and is empty, not a scan of every sent row, when
// none is old enough.
func (d *Store) DeleteSent(ctx context.Context, db store.DB, before time.Time, limit int) (int64, error) {
	b := d.Build()
	return d.Exec(ctx, db, b.W("DELETE FROM ", d.Table, " WHERE status = 'sent' AND available_at < ", b.Time(before),
		" AND sent_at < ", b.Time(before), " ORDER BY available_at LIMIT ", b.Limit(limit)).Query())
}

// EnsureOrdering implements store.Store: no partial index, so status is
// in it and the probe reads only the aggregate's unsent rows; InnoDB
// appends the primary key (seq) to every secondary index, so seq order is
// served too. InnoDB builds it online, but takes a metadata lock at the
// start and end that queues behind open publishing transactions, and
// publishers queue behind it: on MariaDB WAIT bounds that wait (the relay
// tries again on its next cycle). Relays that start together take turns
// under a named lock of the database and index, so that the later ones find
// the index built instead of timing out on the first one's metadata lock.
func (d *Store) EnsureOrdering(ctx context.Context, db *sql.DB) error {
	name := d.name + "_aggregate_idx"
	if ok, err := d.Exists(ctx, db, name); err != nil || ok {
		return err
	}
	ddl := "CREATE INDEX `" + name + "` ON " + d.Table + " (aggregate_type, aggregate_id, status, seq)"
	if d.mariadb.Load() {
		ddl += " WAIT 2"
	}
	return store.Serialized(ctx, db,
		sqlbuild.Query{SQL: "SELECT GET_LOCK(CONCAT(DATABASE(), '.', ?), 0)", Args: []any{name}},
		sqlbuild.Query{SQL: "SELECT RELEASE_LOCK(CONCAT(DATABASE(), '.', ?))", Args: []any{name}},
		func(conn store.DB) error { return store.Ensure(ctx, conn, d.Exists, name, ddl) })
}

// check refuses, at db.Use, what would fail later: a server without SKIP
// LOCKED, a DSN without parseTime (every GORM read of a time column would
// fail), and statement-based binary logging, under which the claim's READ
// COMMITTED locking read is refused (error 1665).
func (d *Store) Check(ctx context.Context, gdb *gorm.DB, _ *slog.Logger) error {
	db, err := gdb.DB()
	if err != nil {
		return fmt.Errorf("outbox: %w", err)
	}
	var version string
	if err := db.QueryRowContext(ctx, "SELECT VERSION()").Scan(&version); err != nil {
		return fmt.Errorf("outbox: inspect the MySQL server: %w", err)
	}
	if err := CheckVersion(version); err != nil {
		return err
	}
	d.mariadb.Store(strings.Contains(strings.ToLower(version), "mariadb"))
	var probe any
	if err := db.QueryRowContext(ctx, "SELECT CAST('2000-01-01 00:00:00' AS DATETIME)").Scan(&probe); err != nil {
		return fmt.Errorf("outbox: inspect the MySQL connection: %w", err)
	}
	if _, ok := probe.(time.Time); !ok {
		return fmt.Errorf("%w: the MySQL DSN lacks parseTime=True, without which time columns cannot be read into time.Time; open GORM with a DSN such as \"user:pass@tcp(host:3306)/db?charset=utf8mb4&parseTime=True&loc=Local\"", errs.ErrInvalidConfig)
	}
	var (
		logBin int
		format string
	)
	if err := db.QueryRowContext(ctx, "SELECT @@log_bin, @@SESSION.binlog_format").Scan(&logBin, &format); err != nil {
		return fmt.Errorf("outbox: inspect the MySQL server's binary log settings: %w", err)
	}
	return CheckBinlog(logBin == 1, format)
}

// CheckBinlog refuses statement-based binary logging.
func CheckBinlog(logBin bool, format string) error {
	if logBin && strings.EqualFold(format, "STATEMENT") {
		return fmt.Errorf("%w: binlog_format=STATEMENT: the relay claims rows at READ COMMITTED, which statement-based binary logging refuses (error 1665); set binlog_format=ROW (or MIXED) on the server", errs.ErrServerSetting)
	}
	return nil
}

// CheckVersion requires FOR UPDATE SKIP LOCKED: MySQL 8.0.1, MariaDB
// 10.6.
func CheckVersion(version string) error {
	mariadb := strings.Contains(strings.ToLower(version), "mariadb")
	nums := strings.SplitN(strings.SplitN(version, "-", 2)[0], ".", 4)
	part := func(i int) int {
		if i >= len(nums) {
			return 0
		}
		n, _ := strconv.Atoi(nums[i])
		return n
	}
	v := [3]int{part(0), part(1), part(2)}
	ok := func(min [3]int) bool {
		for i := range v {
			if v[i] != min[i] {
				return v[i] > min[i]
			}
		}
		return true
	}
	switch {
	case mariadb && !ok([3]int{10, 6, 0}):
		return fmt.Errorf("%w: MariaDB %s; the outbox needs MariaDB 10.6 or later (FOR UPDATE SKIP LOCKED)", errs.ErrUnsupportedVersion, version)
	case !mariadb && !ok([3]int{8, 0, 1}):
		return fmt.Errorf("%w: MySQL %s; the outbox needs MySQL 8.0.1 or later (FOR UPDATE SKIP LOCKED)", errs.ErrUnsupportedVersion, version)
	}
	return nil
}
