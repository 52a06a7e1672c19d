-- The inbox table for MySQL and MariaDB, as db.Use creates it unless
-- Config.DisableAutoMigrate is set: the messages each consumer has consumed
-- (outbox.Consume records the pair in the transaction of its effect). For
-- another name, replace every outbox_inbox (outbox.InboxSchemaSQL does this
-- for you). The binary collation compares IDs byte for byte: "a" and "A"
-- are two messages.
CREATE TABLE IF NOT EXISTS `outbox_inbox` (
    consumer    VARCHAR(255) NOT NULL,
    message_id  VARCHAR(255) NOT NULL,
    consumed_at DATETIME(6)  NOT NULL,
    PRIMARY KEY (consumer, message_id),
    -- Retention deletes the pairs consumed before its window, oldest
    -- first, in small batches.
    KEY `outbox_inbox_consumed_idx` (consumed_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
