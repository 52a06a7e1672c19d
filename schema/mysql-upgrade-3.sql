-- Upgrades an outbox table of schema version 2 to version 3 on MySQL and
-- MariaDB; db.Use runs it when it finds a version 2 table (unless
-- Config.DisableAutoMigrate is set). For another table name, replace every
-- outbox_events (outbox.UpgradeSQL does this for you). MySQL commits each
-- ALTER TABLE by itself: the lock below (one per database and table, held
-- by the session; db.Use refuses to go on without it and always releases
-- it) keeps two instances from upgrading at once, and the one ALTER changes
-- every column, so that the table is either version 2 or version 3.
SELECT GET_LOCK(CONCAT(DATABASE(), '.outbox_events.upgrade'), 60);
-- Version 2 did not record which IDs a publisher chose: every existing ID
-- counts as chosen (named_id), so each stays unique.
ALTER TABLE `outbox_events`
    DROP INDEX `outbox_events_id_key`,
    DROP INDEX `outbox_events_sent_idx`,
    DROP CONSTRAINT `outbox_events_status_check`,
    CHANGE COLUMN id named_id VARCHAR(255) NULL,
    ADD COLUMN id BINARY(16) NOT NULL DEFAULT 0x00000000000000000000000000000000 AFTER seq,
    MODIFY COLUMN idempotency_key VARCHAR(255) NULL,
    MODIFY COLUMN status ENUM('pending', 'sent', 'failed') NOT NULL DEFAULT 'pending',
    MODIFY COLUMN created_at DATETIME(6) NULL,
    MODIFY COLUMN updated_at DATETIME(6) NULL,
    ADD CONSTRAINT `outbox_events_named_id_key` UNIQUE (named_id);
UPDATE `outbox_events` SET id = CASE
        WHEN named_id REGEXP '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$' THEN UNHEX(REPLACE(named_id, '-', ''))
        ELSE UNHEX(MD5(CONCAT('outbox:', named_id))) END,
    idempotency_key = NULLIF(idempotency_key, named_id);
ALTER TABLE `outbox_events` ALTER COLUMN id DROP DEFAULT;
-- Added to version 3 after its release: the overview's rollup, the
-- failed index and the event history (db.Use also creates them on a
-- version 3 table that lacks them).
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
SELECT RELEASE_LOCK(CONCAT(DATABASE(), '.outbox_events.upgrade'));
