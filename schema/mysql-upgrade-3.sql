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
SELECT RELEASE_LOCK(CONCAT(DATABASE(), '.outbox_events.upgrade'));
