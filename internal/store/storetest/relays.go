package storetest

import (
	"testing"
	"time"

	"github.com/gorm-outbox/outbox/internal/store"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// relaysSince runs Relays.
func (e *env) relaysSince(since time.Time) []store.RelayRow {
	e.t.Helper()
	got, err := e.s.Relays(e.ctx, e.db, since)
	require.NoError(e.t, err, "Relays(%s)", since)
	return got
}

// beat runs Beat.
func (e *env) beat(r store.RelayRow) {
	e.t.Helper()
	require.NoError(e.t, e.s.Beat(e.ctx, e.db, r), "Beat(%s)", r.ID)
}

// sameRelays asserts the rows Relays read are want, in order.
func sameRelays(t *testing.T, want, got []store.RelayRow, what string) {
	t.Helper()
	if !assert.Len(t, got, len(want), "%s: %+v", what, got) {
		return
	}
	for i := range want {
		w, g := want[i], got[i]
		for _, c := range []struct {
			name     string
			want, at time.Time
		}{{"Started", w.Started, g.Started}, {"Seen", w.Seen, g.Seen}, {"LastClaim", w.LastClaim, g.LastClaim}, {"LastDelivery", w.LastDelivery, g.LastDelivery}} {
			if c.want.IsZero() {
				assert.True(t, c.at.IsZero(), "%s: %s's %s: want none, got %s", what, w.ID, c.name, c.at)
			} else {
				sameTime(t, c.want, c.at, "%s: %s's %s", what, w.ID, c.name)
			}
		}
		w.Started, w.Seen, w.LastClaim, w.LastDelivery = time.Time{}, time.Time{}, time.Time{}, time.Time{}
		g.Started, g.Seen, g.LastClaim, g.LastDelivery = time.Time{}, time.Time{}, time.Time{}, time.Time{}
		assert.Equal(t, w, g, "%s: row %d", what, i)
	}
}

func testRelays(t *testing.T, su *suite) {
	t.Run("Beat", func(t *testing.T) {
		t.Parallel()
		e := setup(t, su)
		assert.Empty(t, e.relaysSince(time.Time{}), "no relay has beaten")
		started := now.Add(-time.Hour)
		a := store.RelayRow{ID: "r-a", Name: "billing", Host: "host-1", PID: 4242, Mode: "persistent", Started: started, Seen: now}
		b := store.RelayRow{ID: "r-b", Name: "audit", Host: "høst-2", PID: 1, Mode: "logical", Started: started,
			Seen: now.Add(-10 * time.Minute), LastClaim: now.Add(-11 * time.Minute), LastDelivery: now.Add(-12 * time.Minute), LastError: `boom: "ünï"`}
		c := store.RelayRow{ID: "r-c", Name: "billing", Host: "host-3", PID: 7, Mode: "persistent", Started: started, Seen: now.Add(-time.Minute)}
		e.beat(a)
		e.beat(b)
		e.beat(c)
		sameRelays(t, []store.RelayRow{b, a, c}, e.relaysSince(time.Time{}), "every relay, by name")

		// Replaced: its row follows every beat, a claim, a delivery and an
		// error written and then cleared.
		a.Seen, a.LastClaim, a.LastDelivery, a.LastError = now.Add(time.Minute), now, now.Add(30*time.Second), "down"
		e.beat(a)
		sameRelays(t, []store.RelayRow{b, a, c}, e.relaysSince(time.Time{}), "a beat again")
		a.Seen, a.LastError = now.Add(2*time.Minute), ""
		e.beat(a)
		sameRelays(t, []store.RelayRow{b, a, c}, e.relaysSince(time.Time{}), "a's error cleared")

		// Seen at or after since.
		sameRelays(t, []store.RelayRow{a, c}, e.relaysSince(c.Seen), "seen since c's beat")
		sameRelays(t, []store.RelayRow{a}, e.relaysSince(c.Seen.Add(µs)), "seen after c's beat")
		assert.Empty(t, e.relaysSince(a.Seen.Add(time.Second)), "none seen since")
	})

	t.Run("ForgetRelays", func(t *testing.T) {
		t.Parallel()
		e := setup(t, su)
		cut := now.Add(-24 * time.Hour)
		var rows []store.RelayRow
		for i, seen := range []time.Time{cut.Add(-2 * time.Minute), cut.Add(-time.Minute), cut} {
			r := store.RelayRow{ID: ids("relay-", 3)[i], Name: "svc", Host: "h", PID: i + 1, Mode: "persistent", Started: cut.Add(-time.Hour), Seen: seen}
			e.beat(r)
			rows = append(rows, r)
		}
		n, err := e.s.ForgetRelays(e.ctx, e.db, cut)
		require.NoError(t, err)
		assert.EqualValues(t, 2, n, "the relays not seen since the cutoff")
		sameRelays(t, rows[2:], e.relaysSince(time.Time{}), "a relay seen at the cutoff stays")
		n, err = e.s.ForgetRelays(e.ctx, e.db, cut)
		require.NoError(t, err)
		assert.Zero(t, n, "nothing left to forget")
	})
}
