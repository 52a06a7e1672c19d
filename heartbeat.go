package outbox

import (
	"cmp"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	"github.com/gorm-outbox/outbox/internal/engine"
	"github.com/gorm-outbox/outbox/internal/maint"
	"github.com/gorm-outbox/outbox/internal/store"
)

// A relay records that it runs, in a table beside the outbox table (where
// the store has the store.Relays role): every relayBeat, its row with when
// it last claimed and delivered events and its last cycle's error. A relay
// whose row is older than relayAlive is gone; rows older than relayForget
// are deleted by the relays that remain.
const (
	relayBeat   = 5 * time.Second
	relayAlive  = 3 * relayBeat
	relayForget = 24 * time.Hour
)

// RelayStatus is what a relay last recorded of itself ([Stats] Relays).
type RelayStatus struct {
	// Name is RelayConfig.Name; Host and PID where it runs; Mode the
	// outbox's mode (persistent or logical).
	Name, Host string
	PID        int
	Mode       string
	// Started is when it started; Seen when it last recorded itself.
	Started, Seen time.Time
	// LastClaim is when it last claimed events from the table, and
	// LastDelivery when it last delivered one (from the table or, in
	// Logical mode, from the stream); zero for never.
	LastClaim, LastDelivery time.Time
	// LastError is its last cycle's error ("" when that cycle went
	// through): the table unreachable, a destination down, the standbys
	// behind.
	LastError string
}

// relayLife is what a relay records of itself.
type relayLife struct {
	id, name, host, mode string
	pid                  int
	now                  func() time.Time // the outbox's clock
	started              time.Time
	lastClaim, lastSent  atomic.Int64 // UnixNano, 0 for never
	lastErr              atomic.Pointer[string]
}

func (l *relayLife) init(mode Mode, name string, now func() time.Time) {
	var b [8]byte
	_, _ = rand.Read(b[:])
	l.id, l.mode, l.pid = hex.EncodeToString(b[:]), mode.String(), os.Getpid()
	l.host, _ = os.Hostname()
	l.name = cmp.Or(name, fmt.Sprintf("%s:%d", l.host, l.pid))
	l.now = now
	l.started = now()
}

func (l *relayLife) claimed()   { l.lastClaim.Store(l.now().UnixNano()) }
func (l *relayLife) delivered() { l.lastSent.Store(l.now().UnixNano()) }

// cycle records how a cycle ended.
func (l *relayLife) cycle(err error) {
	if err == nil {
		l.lastErr.Store(nil)
		return
	}
	text := engine.LastError(err)
	l.lastErr.Store(&text)
}

func unixTime(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns).UTC()
}

// row is the relay's row as of now.
func (l *relayLife) row(now time.Time) store.RelayRow {
	r := store.RelayRow{
		ID: l.id, Name: l.name, Host: l.host, PID: l.pid, Mode: l.mode,
		Started: l.started, Seen: now,
		LastClaim: unixTime(l.lastClaim.Load()), LastDelivery: unixTime(l.lastSent.Load()),
	}
	if e := l.lastErr.Load(); e != nil {
		r.LastError = *e
	}
	return r
}

// heartbeat is the relay's service that writes its row every relayBeat,
// and deletes the rows of relays long gone about once a minute.
func (r *Relay) heartbeat(rs store.Relays) maint.Service {
	var beats int
	return maint.Service{
		Name: "recording the relay's heartbeat", Every: relayBeat,
		Pass: func(ctx context.Context) (int64, error) {
			ctx, cancel := context.WithTimeout(ctx, r.cfg.StatementTimeout)
			defer cancel()
			now := r.o.now()
			if err := rs.Beat(ctx, r.table.DB, r.life.row(now)); err != nil {
				return 0, fmt.Errorf("write the relay's row: %w", err)
			}
			if beats++; beats%12 != 1 {
				return 1, nil
			}
			n, err := rs.ForgetRelays(ctx, r.table.DB, now.Add(-relayForget))
			if err != nil {
				return 1, fmt.Errorf("delete the rows of relays long gone: %w", err)
			}
			return 1 + n, nil
		},
	}
}

// relayStatus reads the relays of the table into st: those alive, and the
// last delivery any recorded.
func (o *Outbox) relayStatus(ctx context.Context, db *sql.DB, st *Stats) error {
	rs, ok := o.store.(store.Relays)
	if !ok {
		return nil
	}
	rows, err := rs.Relays(ctx, db, time.Time{})
	if err != nil {
		return fmt.Errorf("outbox: read the relays: %w", err)
	}
	alive := o.now().Add(-relayAlive)
	st.Relays = nil
	for _, r := range rows {
		if r.LastDelivery.After(st.LastDelivery) {
			st.LastDelivery = r.LastDelivery
		}
		if r.Seen.After(st.RelaySeen) {
			st.RelaySeen = r.Seen
		}
		if !r.Seen.Before(alive) {
			st.Relays = append(st.Relays, RelayStatus{
				Name: r.Name, Host: r.Host, PID: r.PID, Mode: r.Mode, Started: r.Started, Seen: r.Seen,
				LastClaim: r.LastClaim, LastDelivery: r.LastDelivery, LastError: r.LastError,
			})
		}
	}
	return nil
}
