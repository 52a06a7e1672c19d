package outbox

import "time"

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
// schema/mysql.sql.
//
// On MySQL the time columns hold UTC: read them with loc=UTC in the DSN,
// or take a time.Time read with another loc as UTC wall-clock time.
type Row struct {
	ID             string `gorm:"primaryKey;size:255"`
	Seq            int64  `gorm:"->"` // assigned by the database in write order
	EventType      string `gorm:"size:255;not null"`
	AggregateType  string `gorm:"size:255;not null;default:''"`
	AggregateID    string `gorm:"size:255;not null;default:''"`
	IdempotencyKey string `gorm:"size:255;not null;uniqueIndex"`
	Payload        string `gorm:"not null"`
	Headers        *string
	Status         Status `gorm:"size:16;not null;default:pending"`
	Attempts       int    `gorm:"not null;default:0"`
	LastError      *string
	AvailableAt    time.Time `gorm:"not null"`
	LockedUntil    *time.Time
	OccurredAt     time.Time `gorm:"not null"`
	CreatedAt      time.Time `gorm:"not null"`
	UpdatedAt      time.Time `gorm:"not null"`
	SentAt         *time.Time
}

// TableName is the default table name; use db.Table(ob.Table()) when
// Config.Table is set.
func (Row) TableName() string { return DefaultTable }
