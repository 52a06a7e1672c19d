package sqlbuild

import (
	"time"

	"github.com/gorm-outbox/outbox/internal/store"
)

// InboxConsume is the inbox INSERT that records a pair unless it is there:
// insert is the statement's verb ("INSERT INTO", or MySQL's "INSERT IGNORE
// INTO"), onConflict what follows the row (PostgreSQL's and SQLite's "ON
// CONFLICT DO NOTHING"), table the quoted inbox table.
func (s *Syntax) InboxConsume(insert, table, onConflict, consumer, messageID string, now time.Time) store.Query {
	b := s.Build()
	row := InboxRow(insert, table, onConflict, b.Arg(consumer), b.Arg(messageID), b.Time(now))
	return store.Query{SQL: row, Args: b.args}
}

// InboxRow is the inbox INSERT with its three values spelled as given:
// placeholders, or literals where the statement must travel without
// arguments (a store.InboxLead's text).
func InboxRow(insert, table, onConflict, consumer, messageID, at string) string {
	return insert + " " + table + " (consumer, message_id, consumed_at) VALUES (" + consumer + ", " + messageID + ", " + at + ")" + onConflict
}

// ForgetConsumedByKey deletes up to limit pairs consumed before before,
// oldest first, through the primary key (databases whose DELETE has no
// LIMIT but that compare row values).
func (s *Syntax) ForgetConsumedByKey(table string, before time.Time, limit int) store.Query {
	b := s.Build()
	return b.W("DELETE FROM ", table, " WHERE (consumer, message_id) IN (SELECT consumer, message_id FROM ", table,
		" WHERE consumed_at < ", b.Time(before), " ORDER BY consumed_at LIMIT ", b.Limit(limit), ")").Query()
}
