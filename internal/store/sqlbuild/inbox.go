package sqlbuild

import (
	"context"
	"time"

	"github.com/gorm-outbox/outbox/internal/store"
)

// InboxInsert is the inbox INSERT that records a pair unless it is there:
// insert is the statement's verb ("INSERT INTO", or MySQL's "INSERT IGNORE
// INTO"), onConflict what follows the row (PostgreSQL's and SQLite's "ON
// CONFLICT DO NOTHING"), table the quoted inbox table.
func (s *Syntax) InboxInsert(insert, table, onConflict, consumer, messageID string, now time.Time) Query {
	b := s.Build()
	row := InboxRow(insert, table, onConflict, b.Arg(consumer), b.Arg(messageID), b.Time(now))
	return Query{SQL: row, Args: b.args}
}

// InboxRow is the inbox INSERT with its three values spelled as given:
// placeholders, or literals where the statement must travel without
// arguments (a Lead's text).
func InboxRow(insert, table, onConflict, consumer, messageID, at string) string {
	return insert + " " + table + " (consumer, message_id, consumed_at) VALUES (" + consumer + ", " + messageID + ", " + at + ")" + onConflict
}

// Recorded runs an inbox INSERT and reports whether it recorded the pair.
func (s *Syntax) Recorded(ctx context.Context, db store.DB, q Query) (bool, error) {
	n, err := s.Exec(ctx, db, q)
	return n > 0, err
}

// ForgetConsumedByKey deletes up to limit pairs consumed before before,
// oldest first, through the primary key (databases whose DELETE has no
// LIMIT but that compare row values).
func (s *Syntax) ForgetConsumedByKey(ctx context.Context, db store.DB, table string, before time.Time, limit int) (int64, error) {
	b := s.Build()
	return s.Exec(ctx, db, b.W("DELETE FROM ", table, " WHERE (consumer, message_id) IN (SELECT consumer, message_id FROM ", table,
		" WHERE consumed_at < ", b.Time(before), " ORDER BY consumed_at LIMIT ", b.Limit(limit), ")").Query())
}
