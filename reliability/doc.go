// Package reliability holds the tests that back RELIABILITY.md: crash
// recovery with a SIGKILLed relay, database faults (connection cuts through
// a test-controlled TCP proxy, a test-owned PostgreSQL stopped and restarted
// under a running relay), SQLite under concurrent writers, hostile handlers,
// and the security basics (no payloads in logs or errors, user strings are
// data, never SQL). It has no API; everything is in the _test.go files.
//
// PostgreSQL tests read OUTBOX_TEST_POSTGRES_DSN (for example
// postgres://postgres@127.0.0.1:5432/test?sslmode=disable); they skip when it
// is unset and fail when it is set but the server is unreachable. Each test
// works in its own schema, dropped afterwards.
//
// The crash and connection-fault tests also run on MySQL/MariaDB, in a
// subtest per server, reading OUTBOX_TEST_MYSQL_DSN (for example
// root@tcp(127.0.0.1:3306)/test?charset=utf8mb4&parseTime=True&loc=Local)
// the same way. Each test works in a database of its own (t_<random>),
// dropped afterwards; the crash test also creates a user per child process
// (MySQL shows sessions by user, not by application name), so the DSN's
// user needs CREATE USER and GRANT OPTION, as root has.
//
// TestPostgresFailover (Persistent mode) owns its clusters: a primary and a
// streaming standby made with PostgreSQL's own tools (initdb, pg_basebackup
// -R, pg_ctl promote; internal/pgtest), for synchronous and for
// asynchronous replication. A writer and a relay connect through a
// multi-host DSN with target_session_attrs=read-write; the primary is
// stopped with an immediate shutdown at a random moment under load, the
// standby promoted and the old primary rebuilt as the new standby,
// OUTBOX_FAILOVER_ROUNDS times per variant (default 2; set it to 50 or more
// for a long run), the kill moments drawn from OUTBOX_FAILOVER_SEED
// (logged; default random). It needs the PostgreSQL server binaries
// (/usr/lib/postgresql/15/bin or OUTBOX_TEST_PG_BINDIR), not
// OUTBOX_TEST_POSTGRES_DSN, and skips without them except under CI.
//
// TestLogicalFailover is the same rig with wal_level=logical on every
// node and the outbox in Logical mode: on PostgreSQL 15 the slot exists
// only on the primary, so each promotion loses it. Per failover it
// asserts that Publish fails with ErrNoSlot on the new primary until a
// slot exists, that the relay logs the loss at Error and counts it in
// Stats.SlotLost, that a new process's db.Use creates the slot and logs
// that it replaces a lost one, and that the relay then streams it and
// delivers; it measures the window (commits on the old primary that the
// new one has and that were never delivered) and reports it in a
// LOGICAL-FAILOVER-RESULT line. OUTBOX_LOGICAL_FAILOVER_ROUNDS failovers
// per variant (default 2), the kill moments drawn from
// OUTBOX_FAILOVER_SEED like TestPostgresFailover's.
package reliability
