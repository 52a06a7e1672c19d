package sqlbuild

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/gorm-outbox/outbox/internal/store"
)

// Query is one statement and its arguments. Statements never contain
// event data, only placeholders.
type Query struct {
	SQL  string
	Args []any
}

// Statement is q's text and arguments (store.Serialized's lock).
func (q Query) Statement() (string, []any) { return q.SQL, q.Args }

// check refuses a statement with more parameters than the database takes:
// a store that chunks wrongly fails here, in the conformance suite, not at
// the database with an error of its own.
func (s *Syntax) check(q Query) error {
	if max := s.Lim.MaxParams; max > 0 && len(q.Args) > max {
		return fmt.Errorf("%w: %d parameters, the limit is %d (in: %.60s)", store.ErrTooManyParams, len(q.Args), max, q.SQL)
	}
	return nil
}

// Exec runs q on db and returns the rows it affected.
func (s *Syntax) Exec(ctx context.Context, db store.DB, q Query) (int64, error) {
	if err := s.check(q); err != nil {
		return 0, err
	}
	res, err := db.ExecContext(ctx, q.SQL, q.Args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// Each runs q on db and calls scan on each row.
func (s *Syntax) Each(ctx context.Context, db store.DB, q Query, scan func(*sql.Rows) error) error {
	if err := s.check(q); err != nil {
		return err
	}
	rows, err := db.QueryContext(ctx, q.SQL, q.Args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := scan(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}

// Row runs q on db and scans its one row into dest (sql.ErrNoRows when
// there is none).
func (s *Syntax) Row(ctx context.Context, db store.DB, q Query, dest ...any) error {
	if err := s.check(q); err != nil {
		return err
	}
	return db.QueryRowContext(ctx, q.SQL, q.Args...).Scan(dest...)
}

// Seqs runs q, which selects one column of seqs, and returns them.
func (s *Syntax) seqList(ctx context.Context, db store.DB, q Query) ([]int64, error) {
	var seqs []int64
	err := s.Each(ctx, db, q, func(rows *sql.Rows) error {
		var seq int64
		if err := rows.Scan(&seq); err != nil {
			return err
		}
		seqs = append(seqs, seq)
		return nil
	})
	return seqs, err
}

// ExecChunks runs the statements build returns for n items, at most chunk
// at a time, and returns the rows they affected.
func (s *Syntax) ExecChunks(ctx context.Context, db store.DB, n, chunk int, build func(i, j int) Query) (int64, error) {
	var total int64
	for i := 0; i < n; i += chunk {
		got, err := s.Exec(ctx, db, build(i, min(i+chunk, n)))
		total += got
		if err != nil {
			return total, err
		}
	}
	return total, nil
}

// PerStatement is how many rows of per parameters each, beside fixed
// others, one statement takes: the store's cap, within its parameter limit.
func (s *Syntax) PerStatement(cap, per, fixed int) int {
	if s.Lim.MaxParams > 0 {
		cap = min(cap, (s.Lim.MaxParams-fixed)/per)
	}
	return max(cap, 1)
}

// QueryClaimed runs a statement returning claimed rows (in ClaimColumns'
// order) and scans them; limit, the claim's, sizes the batch. The key
// comes as the column holds it, NULL when it is the ID (a generated
// event's), so that the driver makes no second copy of the ID per row.
func (s *Syntax) QueryClaimed(ctx context.Context, db store.DB, q Query, limit int) ([]store.Claimed, error) {
	batch := make([]store.Claimed, 0, min(max(limit, 0), 1000))
	// Scan's destinations escape to the heap: declared once per statement,
	// not per row, they cost a relay five allocations a batch instead of
	// five an event.
	var (
		c            store.Claimed
		key, headers sql.NullString
		occ, added   DBTime
		fresh        int
	)
	err := s.Each(ctx, db, q, func(rows *sql.Rows) error {
		c = store.Claimed{}
		if err := rows.Scan(&c.Seq, &c.ID, &c.Type, &c.AggregateType, &c.AggregateID, &key,
			&c.Payload, &headers, &c.Attempts, &occ, &added, &fresh); err != nil {
			return err
		}
		c.Key = c.ID
		if key.Valid {
			c.Key = key.String
		}
		if headers.Valid && headers.String != "" {
			c.Headers = []byte(headers.String)
		}
		c.OccurredAt, c.CreatedAt, c.Fresh = occ.T, added.T, fresh == 1
		batch = append(batch, c)
		return nil
	})
	return batch, err
}

// queryRows runs a statement selecting RowColumns and scans the rows.
func (s *Syntax) queryRows(ctx context.Context, db store.DB, q Query) ([]store.Row, error) {
	var out []store.Row
	err := s.Each(ctx, db, q, func(rows *sql.Rows) error {
		var (
			r                                 store.Row
			payload                           []byte
			headers, lastErr                  sql.NullString
			avail, locked, occ, added, upd, s DBTime
		)
		if err := rows.Scan(&r.Seq, &r.ID, &r.EventType, &r.AggregateType, &r.AggregateID, &r.Key,
			&payload, &headers, &r.Status, &r.Attempts, &lastErr, &avail, &locked, &occ, &added, &upd, &s); err != nil {
			return err
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
		return nil
	})
	return out, err
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
