-- The outbox table for MySQL 8.0.1+ and MariaDB 10.6+ (schema version 3), as db.Use creates it
-- unless Config.DisableAutoMigrate is set. For another table name, replace
-- every outbox_events (outbox.SchemaSQL does this for you); a table created
-- by version 2 is upgraded by db.Use, or by the statements of
-- schema/mysql-upgrade-3.sql (outbox.UpgradeSQL).
-- Times are DATETIME(6) holding UTC, written and read by the library as
-- UTC whatever the DSN's loc and the server's time_zone are. The binary
-- collation makes IDs and idempotency keys compare byte for byte, as on
-- PostgreSQL and SQLite ("A" and "a" are different keys).
--
-- NULL stands for a value another column gives (outbox.List, Get and the
-- outbox command show the value): idempotency_key NULL is the event's ID,
-- created_at NULL is occurred_at, updated_at NULL is created_at.
CREATE TABLE IF NOT EXISTS `outbox_events` (
    -- Assigned in write order: per-aggregate delivery follows it, not the
    -- writers' clocks. The primary key, so InnoDB appends rows in order
    -- and every secondary index carries 8 bytes, not an ID.
    seq             BIGINT       NOT NULL AUTO_INCREMENT,
    -- The event's ID as 16 bytes (BIN_TO_UUID(id) on MySQL reads it). An ID
    -- the publisher chose is in named_id, and here as a UUID derived from it
    -- (itself, when it is one).
    id              BINARY(16)   NOT NULL,
    named_id        VARCHAR(255) NULL,
    event_type      VARCHAR(255) NOT NULL,
    aggregate_type  VARCHAR(255) NOT NULL DEFAULT '',
    aggregate_id    VARCHAR(255) NOT NULL DEFAULT '',
    idempotency_key VARCHAR(255) NULL,
    payload         JSON         NOT NULL,
    headers         JSON         NULL,
    status          ENUM('pending', 'sent', 'failed') NOT NULL DEFAULT 'pending',
    attempts        INT          NOT NULL DEFAULT 0,
    last_error      TEXT         NULL,
    available_at    DATETIME(6)  NOT NULL,
    locked_until    DATETIME(6)  NULL,
    occurred_at     DATETIME(6)  NOT NULL,
    created_at      DATETIME(6)  NULL,
    updated_at      DATETIME(6)  NULL,
    sent_at         DATETIME(6)  NULL,
    PRIMARY KEY (seq),
    -- The first write wins on an ID or a key the publisher chose. There are
    -- no partial indexes: a generated event enters these as NULL.
    CONSTRAINT `outbox_events_named_id_key` UNIQUE (named_id),
    CONSTRAINT `outbox_events_idempotency_key_key` UNIQUE (idempotency_key),
    -- The claim reads (status = 'pending', available_at <= now) ordered by
    -- (available_at, seq), one range of this index whatever number of sent
    -- rows sits in the 'sent' range. Retention reads sent rows by seq, from
    -- the oldest: no index of its own.
    INDEX `outbox_events_pending_idx` (status, available_at, seq)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- The overview's counts (outbox.Outbox.Overview and the dashboard's charts):
-- the sent events per minute and event type, rolled up from this table by
-- the relays every few seconds (and by Overview itself when they lag), so
-- that a chart over a week reads minutes, not a million rows. Nothing on
-- the write path touches these tables. minute counts whole minutes since
-- the Unix epoch (UTC) and starts a span of 1, 10 or 60 minutes (the
-- three are kept, for charts by the minute, by 10 minutes and by the hour;
-- minutes for a day, the others 8 days); published counts the sent events
-- created in the span, delivered those sent in it, and d0..d17 the latter by delivery
-- delay (created to sent): under 1, 2.5, 5, 10, 25, 50, 100, 250, 500 ms,
-- 1, 2.5, 5, 10, 30 s, 1, 5, 30 min, and longer.
CREATE TABLE IF NOT EXISTS `outbox_events_rollup` (
    span            SMALLINT     NOT NULL,
    minute          BIGINT       NOT NULL,
    event_type      VARCHAR(255) NOT NULL,
    published       BIGINT       NOT NULL DEFAULT 0,
    delivered       BIGINT       NOT NULL DEFAULT 0,
    d0              BIGINT       NOT NULL DEFAULT 0,
    d1              BIGINT       NOT NULL DEFAULT 0,
    d2              BIGINT       NOT NULL DEFAULT 0,
    d3              BIGINT       NOT NULL DEFAULT 0,
    d4              BIGINT       NOT NULL DEFAULT 0,
    d5              BIGINT       NOT NULL DEFAULT 0,
    d6              BIGINT       NOT NULL DEFAULT 0,
    d7              BIGINT       NOT NULL DEFAULT 0,
    d8              BIGINT       NOT NULL DEFAULT 0,
    d9              BIGINT       NOT NULL DEFAULT 0,
    d10             BIGINT       NOT NULL DEFAULT 0,
    d11             BIGINT       NOT NULL DEFAULT 0,
    d12             BIGINT       NOT NULL DEFAULT 0,
    d13             BIGINT       NOT NULL DEFAULT 0,
    d14             BIGINT       NOT NULL DEFAULT 0,
    d15             BIGINT       NOT NULL DEFAULT 0,
    d16             BIGINT       NOT NULL DEFAULT 0,
    d17             BIGINT       NOT NULL DEFAULT 0,
    PRIMARY KEY (span, minute, event_type)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- One row: the rows sent before rolled_until are in the rollup (the relay
-- sets a sent row's available_at to its sent_at, so the pending index
-- finds them by time); low_seq is unused here (the pending index counts
-- pending rows).
CREATE TABLE IF NOT EXISTS `outbox_events_rollup_state` (
    id              SMALLINT     NOT NULL PRIMARY KEY,
    rolled_until    DATETIME(6)  NOT NULL,
    low_seq         BIGINT       NOT NULL,
    low_checked     DATETIME(6)  NOT NULL
) ENGINE=InnoDB;

-- Each event's failed attempts and replays (outbox.Outbox.History, the
-- dashboard's event page): written only when a delivery fails or an
-- operator replays, never by Publish or a delivery that succeeds; deleted
-- by age with the sent rows (Config.RetainSent) and with a purged row.
-- outcome is retry (failed, to be tried again), failed (gave up) or
-- replayed (error is then the error the replay cleared the way past).
CREATE TABLE IF NOT EXISTS `outbox_events_attempts` (
    seq             BIGINT       NOT NULL,
    at              DATETIME(6)  NOT NULL,
    attempt         INT          NOT NULL,
    outcome         VARCHAR(16)  NOT NULL,
    error           TEXT         NULL,
    actor           VARCHAR(255) NULL,
    PRIMARY KEY (seq, at),
    INDEX `outbox_events_attempts_at_idx` (at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- The relays that serve this table (outbox.Stats' Relays, outbox stats
-- --min-relays, the dashboard's relays panel): each relay writes its row
-- every few seconds while it runs, with when it last claimed and delivered
-- events and its last error; the rows of relays not seen for a day are
-- deleted by the others. Never on the write path.
CREATE TABLE IF NOT EXISTS `outbox_events_relays` (
    id               VARCHAR(64)  NOT NULL PRIMARY KEY,
    name             VARCHAR(255) NOT NULL,
    host             VARCHAR(255) NOT NULL,
    pid              INT          NOT NULL,
    mode             VARCHAR(16)  NOT NULL,
    started_at       DATETIME(6)  NOT NULL,
    seen_at          DATETIME(6)  NOT NULL,
    last_claim_at    DATETIME(6)  NULL,
    last_delivery_at DATETIME(6)  NULL,
    last_error       TEXT         NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
