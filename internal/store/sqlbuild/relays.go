package sqlbuild

import (
	"context"
	"database/sql"
	"strings"
	"time"

	"github.com/gorm-outbox/outbox/internal/store"
)

func (s *Syntax) relaysTable() string { return s.Derived("_relays") }

var relayColumns = []string{"id", "name", "host", "pid", "mode", "started_at", "seen_at", "last_claim_at", "last_delivery_at", "last_error"}

// optTimeArg is a time argument, NULL when zero.
func (s *Syntax) optTimeArg(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return s.TimeArg(t)
}

// Beat implements store.Relays.
func (s *Syntax) Beat(ctx context.Context, db store.DB, r store.RelayRow) error {
	b := s.Build()
	var lastErr any
	if r.LastError != "" {
		lastErr = r.LastError
	}
	b.W("INSERT INTO ", s.relaysTable(), " (", strings.Join(relayColumns, ", "), ") VALUES (",
		b.Arg(r.ID), ", ", b.Arg(r.Name), ", ", b.Arg(r.Host), ", ", b.Arg(r.PID), ", ", b.Arg(r.Mode), ", ",
		b.Time(r.Started), ", ", b.Time(r.Seen), ", ", b.Arg(s.optTimeArg(r.LastClaim)), ", ",
		b.Arg(s.optTimeArg(r.LastDelivery)), ", ", b.Arg(lastErr), ")")
	_, err := s.Exec(ctx, db, b.W(s.Upsert("id", relayColumns[1:])).Query())
	return err
}

// Relays implements store.Relays.
func (s *Syntax) Relays(ctx context.Context, db store.DB, since time.Time) ([]store.RelayRow, error) {
	b := s.Build()
	b.W("SELECT id, name, host, pid, mode, ", s.TimeCol("started_at"), ", ", s.TimeCol("seen_at"), ", ",
		s.TimeCol("last_claim_at"), ", ", s.TimeCol("last_delivery_at"), ", last_error FROM ", s.relaysTable())
	if !since.IsZero() {
		b.W(" WHERE seen_at >= ", b.Time(since))
	}
	var out []store.RelayRow
	err := s.Each(ctx, db, b.W(" ORDER BY name, id").Query(), func(rows *sql.Rows) error {
		var (
			r                               store.RelayRow
			started, seen, claimed, deliver DBTime
			lastErr                         sql.NullString
		)
		if err := rows.Scan(&r.ID, &r.Name, &r.Host, &r.PID, &r.Mode, &started, &seen, &claimed, &deliver, &lastErr); err != nil {
			return err
		}
		r.Started, r.Seen, r.LastClaim, r.LastDelivery, r.LastError = started.T, seen.T, claimed.T, deliver.T, lastErr.String
		out = append(out, r)
		return nil
	})
	return out, err
}

// ForgetRelays implements store.Relays.
func (s *Syntax) ForgetRelays(ctx context.Context, db store.DB, before time.Time) (int64, error) {
	b := s.Build()
	return s.Exec(ctx, db, b.W("DELETE FROM ", s.relaysTable(), " WHERE seen_at < ", b.Time(before)).Query())
}
