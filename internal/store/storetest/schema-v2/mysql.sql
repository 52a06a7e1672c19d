-- The outbox table for MySQL 8.0.1+ and MariaDB 10.6+ (schema version 2), as db.Use creates it
-- unless Config.DisableAutoMigrate is set. For another table name, replace
-- every outbox_events (outbox.SchemaSQL does this for you).
-- Times are DATETIME(6) holding UTC, written and read by the library as
-- UTC whatever the DSN's loc and the server's time_zone are. The binary
-- collation makes IDs and idempotency keys compare byte for byte, as on
-- PostgreSQL and SQLite ("A" and "a" are different keys).
CREATE TABLE IF NOT EXISTS `outbox_events` (
    -- Assigned in write order: per-aggregate delivery follows it, not the
    -- writers' clocks. The primary key, so InnoDB appends rows in order
    -- and every secondary index carries 8 bytes, not an ID.
    seq             BIGINT       NOT NULL AUTO_INCREMENT,
    id              VARCHAR(255) NOT NULL,
    event_type      VARCHAR(255) NOT NULL,
    aggregate_type  VARCHAR(255) NOT NULL DEFAULT '',
    aggregate_id    VARCHAR(255) NOT NULL DEFAULT '',
    idempotency_key VARCHAR(255) NOT NULL,
    payload         JSON         NOT NULL,
    headers         JSON         NULL,
    status          VARCHAR(16)  NOT NULL DEFAULT 'pending',
    attempts        INT          NOT NULL DEFAULT 0,
    last_error      TEXT         NULL,
    available_at    DATETIME(6)  NOT NULL,
    locked_until    DATETIME(6)  NULL,
    occurred_at     DATETIME(6)  NOT NULL,
    created_at      DATETIME(6)  NOT NULL,
    updated_at      DATETIME(6)  NOT NULL,
    sent_at         DATETIME(6)  NULL,
    PRIMARY KEY (seq),
    CONSTRAINT `outbox_events_id_key` UNIQUE (id),
    CONSTRAINT `outbox_events_idempotency_key_key` UNIQUE (idempotency_key),
    CONSTRAINT `outbox_events_status_check` CHECK (status IN ('pending', 'sent', 'failed')),
    -- There are no partial indexes: the claim reads (status = 'pending',
    -- available_at <= now) ordered by (available_at, seq), one range of this
    -- index whatever number of sent rows sits in the 'sent' range.
    INDEX `outbox_events_pending_idx` (status, available_at, seq),
    -- Retention deletes sent rows by age in small batches.
    INDEX `outbox_events_sent_idx` (status, sent_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
