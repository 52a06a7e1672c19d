package outboxui

import (
	"strings"
	"time"

	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
)

// health is what the warning at the top of the overview and the list, and
// the overview's relays panel, say: the relays alive, the last delivery,
// and whether events wait with no relay to deliver them or for longer
// than Options.MaxPendingAge. It is one [outbox.Outbox.Stats] reading (the
// overview's is the one its Overview embeds).
type health struct {
	// Read is true once Stats was read: a page that could not read it
	// (a 400 of the list) warns of nothing.
	Read bool
	Now  time.Time
	outbox.Stats
	// MaxAge is Options.MaxPendingAge; 0 when the age warning is off.
	MaxAge time.Duration
	// Logical: the outbox streams its events (Logical mode), so the table
	// holds only the events parked for a retry.
	Logical bool
}

func (h *handler) healthOf(st outbox.Stats) health {
	hl := health{Read: true, Now: h.now(), Stats: st, Logical: h.ob.Mode() == outbox.Logical}
	if h.maxAge > 0 {
		hl.MaxAge = h.maxAge
	}
	return hl
}

// readHealth reads Stats for a page that has no Overview.
func (h *handler) readHealth(db *gorm.DB) (health, error) {
	st, err := h.ob.Stats(db)
	if err != nil {
		return health{}, err
	}
	return h.healthOf(st), nil
}

// NoRelay: events wait and no relay has recorded itself within the last
// 15 s, so nothing delivers them: pending rows, or in Logical mode a slot
// no relay streams.
func (hl health) NoRelay() bool {
	return hl.Read && len(hl.Relays) == 0 && (hl.Pending > 0 || (hl.Logical && !hl.SlotActive))
}

// Behind: the oldest pending event is older than MaxAge.
func (hl health) Behind() bool {
	return hl.Read && hl.MaxAge > 0 && hl.Pending > 0 && hl.OldestPending > hl.MaxAge
}

// Warn: the page warns.
func (hl health) Warn() bool { return hl.NoRelay() || hl.Behind() }

// OldestAt is when the oldest pending event was created, to the second:
// the warning says a time, which stays the same from one refresh to the
// next (an age would change every time, and a screen reader would read
// the warning out again).
func (hl health) OldestAt() time.Time {
	return hl.Now.Add(-hl.OldestPending).Truncate(time.Second)
}

// MaxAgeText is MaxAge as the warning says it: "5m", "90s", "1h30m".
func (hl health) MaxAgeText() string {
	s := hl.MaxAge.String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}

// waiting tells whether row is a pending event waiting for a retry, as
// [outbox.Outbox.RetryNow] would change it at now: due later (a failed
// attempt's backoff, a RetryAfter) and not held by a relay's lease (a
// relay delivering it now).
func waiting(row outbox.Row, now time.Time) bool {
	return row.Status == outbox.StatusPending && row.AvailableAt.After(now) &&
		(row.LockedUntil == nil || !row.LockedUntil.After(now))
}

// nextAttempt is when a pending event in backoff is next attempted, for
// the list's status cell and the event page.
type nextAttempt struct {
	At time.Time
	// Clock is At for a table cell: the time of day, with the date when
	// it is another day's.
	Clock string
	// In is how long until then: "4m12s".
	In string
}

// nextOf returns row's next attempt, nil when it is not waiting for one.
func nextOf(row outbox.Row) *nextAttempt {
	now := time.Now()
	if !waiting(row, now) {
		return nil
	}
	at := row.AvailableAt.UTC()
	n := &nextAttempt{At: at, Clock: at.Format("15:04:05"), In: ago(at.Sub(now))}
	if at.Format("2006-01-02") != now.UTC().Format("2006-01-02") {
		n.Clock = at.Format("Jan 2 15:04:05")
	}
	return n
}

// errCell is an error as a table cell shows it: on one line, the event's
// own ID left out (the row shows it; errors written before the causes came
// first held it, and a history repeated it on every row), cut by the
// stylesheet with an ellipsis, and the whole text for its title.
type errCell struct {
	Line, Full string
}

// errOf returns the cell of the error text for the event id; nil when
// there is no error.
func errOf(id string, text *string) *errCell {
	if text == nil || *text == "" {
		return nil
	}
	return &errCell{Line: short(300, withoutID(*text, id)), Full: *text}
}

// withoutID is an error's text without the ID of the event it belongs to:
// "deliver event 0193… to host: 410 Gone" reads "deliver this event to
// host: 410 Gone". Short IDs (under 8 characters) are left, as they may
// be part of other words.
func withoutID(text, id string) string {
	if len(id) < 8 || !strings.Contains(text, id) {
		return text
	}
	for _, q := range []string{`"` + id + `"`, id} {
		text = strings.ReplaceAll(text, "event "+q, "this event")
		text = strings.ReplaceAll(text, "events "+q, "this event")
	}
	return strings.ReplaceAll(text, id, "(this event)")
}
