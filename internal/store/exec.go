package store

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/gorm-outbox/outbox/internal/errs"
)

func unsupported(dialector string, names []string) error {
	slices.Sort(names)
	return fmt.Errorf("%w: %q (supported: %s)", errs.ErrUnsupportedDialect, dialector, strings.Join(names, ", "))
}

// QueryClaimed runs a statement returning claimed rows (in ClaimColumns'
// order) and scans them.
func QueryClaimed(ctx context.Context, q interface {
	QueryContext(context.Context, string, ...any) (*sql.Rows, error)
}, stmt Query) ([]Claimed, error) {
	rows, err := q.QueryContext(ctx, stmt.SQL, stmt.Args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var batch []Claimed
	for rows.Next() {
		var (
			c          Claimed
			headers    sql.NullString
			occ, added DBTime
			fresh      int
		)
		if err := rows.Scan(&c.Seq, &c.ID, &c.Type, &c.AggregateType, &c.AggregateID, &c.Key,
			&c.Payload, &headers, &c.Attempts, &occ, &added, &fresh); err != nil {
			return nil, err
		}
		if headers.Valid && headers.String != "" {
			c.Headers = []byte(headers.String)
		}
		c.OccurredAt, c.CreatedAt, c.Fresh = occ.T, added.T, fresh == 1
		batch = append(batch, c)
	}
	return batch, rows.Err()
}

// ScanRows scans rows selected in RowColumns' order.
func ScanRows(rows *sql.Rows) ([]Row, error) {
	defer rows.Close()
	var out []Row
	for rows.Next() {
		var (
			r                                 Row
			payload                           []byte
			headers, lastErr                  sql.NullString
			avail, locked, occ, added, upd, s DBTime
		)
		if err := rows.Scan(&r.Seq, &r.ID, &r.EventType, &r.AggregateType, &r.AggregateID, &r.Key,
			&payload, &headers, &r.Status, &r.Attempts, &lastErr, &avail, &locked, &occ, &added, &upd, &s); err != nil {
			return nil, err
		}
		r.Payload = string(payload)
		if headers.Valid {
			r.Headers = &headers.String
		}
		if lastErr.Valid {
			r.LastError = &lastErr.String
		}
		r.AvailableAt, r.OccurredAt, r.CreatedAt, r.UpdatedAt = avail.T, occ.T, added.T, upd.T
		r.LockedUntil, r.SentAt = optTime(locked.T), optTime(s.T)
		out = append(out, r)
	}
	return out, rows.Err()
}

func optTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// DBTime scans a timestamp whatever form the driver returns it in:
// PostgreSQL's time.Time, SQLite's stored text, MySQL's text of a
// DATETIME(6) read with CAST. Text carries no zone and is UTC, as every
// time the outbox writes.
type DBTime struct{ T time.Time }

var textTimeFormats = []string{
	"2006-01-02 15:04:05.999999999-07:00",
	"2006-01-02T15:04:05.999999999-07:00",
	"2006-01-02 15:04:05.999999999",
	"2006-01-02T15:04:05.999999999",
	time.RFC3339Nano,
}

// Scan implements sql.Scanner.
func (d *DBTime) Scan(v any) error {
	var s string
	switch x := v.(type) {
	case time.Time:
		d.T = x.UTC()
		return nil
	case nil:
		d.T = time.Time{}
		return nil
	case string:
		s = x
	case []byte:
		s = string(x)
	default:
		return fmt.Errorf("outbox: cannot scan %T as a time", v)
	}
	for _, f := range textTimeFormats {
		if t, err := time.Parse(f, s); err == nil {
			d.T = t.UTC()
			return nil
		}
	}
	return fmt.Errorf("outbox: cannot parse time %q", s)
}

var _ sql.Scanner = (*DBTime)(nil)

// Held is what the table holds under an event ID: the idempotency key
// and when the row was written.
type Held struct {
	Key     string
	Created time.Time
}

// HeldIDs reads, through w's Held, which of ids the table holds, looking
// them up by the IDs (those a publisher chose) and by keys (those chosen,
// which the rows of generated IDs are found by): the one lookup behind
// every duplicate check (Publish's in Persistent mode, the stream's in
// Logical mode). An ID held with another key than the event's is a
// different event reusing it.
func HeldIDs(ctx context.Context, q Querier, w Writer, ids, keys []string) (map[string]Held, error) {
	stmt := w.Held(ids, keys)
	rows, err := q.QueryContext(ctx, stmt.SQL, stmt.Args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	held := make(map[string]Held, len(ids))
	for rows.Next() {
		var (
			id, key string
			added   DBTime
		)
		if err := rows.Scan(&id, &key, &added); err != nil {
			return nil, err
		}
		held[id] = Held{Key: key, Created: added.T}
	}
	return held, rows.Err()
}
