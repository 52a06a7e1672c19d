package outbox

import (
	"time"

	"github.com/google/uuid"
	"gorm.io/gorm"
)

// Status is an outbox row's status, as the status column holds it.
type Status string

// The statuses of an outbox row.
const (
	// StatusPending: waiting for delivery, including a scheduled retry and a
	// row currently claimed by a relay.
	StatusPending Status = "pending"
	// StatusSent: delivered to every handler of its type.
	StatusSent Status = "sent"
	// StatusFailed: gave up after RelayConfig.MaxAttempts attempts (or a
	// [Permanent] error). It stays for a human; [Outbox.Replay] retries it.
	StatusFailed Status = "failed"
)

// Row is one row of the outbox table, for reading it with GORM:
//
//	var failed []outbox.Row
//	db.Table(ob.Table()).Where("status = ?", outbox.StatusFailed).Find(&failed)
//
// The library itself writes the table with plain SQL; the column names are
// fixed and documented in schema/postgres.sql, schema/sqlite.sql and
// schema/mysql.sql. The row is lean (schema version 3): columns whose value
// another gives are NULL, and a Row read with GORM has them filled in
// (AfterFind), so ID, IdempotencyKey, AvailableAt, CreatedAt and UpdatedAt
// read as the outbox's functions show them. In SQL, the event's ID is
// [Outbox.IDColumn] (COALESCE(named_id, id::text) on PostgreSQL: id is a
// UUID column), its key COALESCE(idempotency_key, <the ID>).
//
// On MySQL the time columns hold UTC: read them with loc=UTC in the DSN,
// or take a time.Time read with another loc as UTC wall-clock time.
type Row struct {
	Seq int64 `gorm:"primaryKey;->"` // assigned by the database in write order
	// ID is the event's ID: NamedID when the publisher chose it, else the
	// generated UUID.
	ID string
	// NamedID is the ID the publisher chose, nil when the outbox
	// generated it.
	NamedID        *string
	EventType      string
	AggregateType  string
	AggregateID    string
	IdempotencyKey string
	Payload        string
	Headers        *string
	Status         Status
	Attempts       int
	LastError      *string
	AvailableAt    time.Time
	LockedUntil    *time.Time
	OccurredAt     time.Time
	CreatedAt      time.Time
	UpdatedAt      time.Time
	SentAt         *time.Time
}

// AfterFind fills in the values the lean row leaves NULL: GORM calls it
// for every Row it reads.
func (r *Row) AfterFind(*gorm.DB) error {
	switch {
	case r.NamedID != nil:
		r.ID = *r.NamedID
	case len(r.ID) == 16: // MySQL's BINARY(16)
		r.ID = uuid.UUID([]byte(r.ID)).String()
	}
	if r.IdempotencyKey == "" {
		r.IdempotencyKey = r.ID
	}
	if r.CreatedAt.IsZero() {
		r.CreatedAt = r.OccurredAt
	}
	if r.UpdatedAt.IsZero() {
		r.UpdatedAt = r.CreatedAt
	}
	if r.AvailableAt.IsZero() {
		r.AvailableAt = r.CreatedAt
	}
	return nil
}

// TableName is the default table name; use db.Table(ob.Table()) when
// Config.Table is set.
func (Row) TableName() string { return DefaultTable }
