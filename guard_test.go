package outbox

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// testOutcomeGuards checks that every outcome statement (sent, retry,
// failed, hand back) is guarded by the lease of the claim it reports on: a
// relay whose lease expired, and whose rows another relay has claimed since,
// must leave them alone. Without the guard the late relay would reset a row
// the live one holds, and a third relay would deliver it concurrently.
func testOutcomeGuards(t *testing.T, b backend) {
	e := b.setup(t)
	ctx := t.Context()
	r := e.relay(RelayConfig{Lease: time.Minute})

	type step struct {
		name  string
		write func(ctx context.Context, id string, lease time.Time) error
		check func(t *testing.T, rec Row)
	}
	fail := func(status Status) func(ctx context.Context, id string, lease time.Time) error {
		return func(ctx context.Context, id string, lease time.Time) error {
			return r.markFailed(ctx, []outcome{{ID: id, Status: string(status), Err: "boom", Due: e.ob.now().Add(time.Hour)}}, lease)
		}
	}
	steps := []step{
		{"MarkSent",
			func(ctx context.Context, id string, lease time.Time) error {
				return r.markSent(ctx, []string{id}, lease)
			},
			func(t *testing.T, rec Row) { assert.Equal(t, StatusSent, rec.Status) }},
		{"Retry", fail(StatusPending),
			func(t *testing.T, rec Row) {
				assert.Equal(t, StatusPending, rec.Status)
				require.NotNil(t, rec.LastError)
				assert.Nil(t, rec.LockedUntil)
			}},
		{"Failed", fail(StatusFailed),
			func(t *testing.T, rec Row) { assert.Equal(t, StatusFailed, rec.Status) }},
		{"HandBack",
			func(ctx context.Context, id string, lease time.Time) error {
				return r.release(ctx, []string{id}, lease)
			},
			func(t *testing.T, rec Row) {
				assert.Equal(t, StatusPending, rec.Status)
				assert.Nil(t, rec.LockedUntil)
				assert.Equal(t, 1, rec.Attempts, "the hand-back takes back the attempt its claim counted")
			}},
	}
	for i, s := range steps {
		id := fmt.Sprint("guard-", i)
		require.NoError(t, PublishAlone(e.db, Event{ID: id, Type: "x"}))
		if b.logical { // Logical mode's Publish writes no row: another relay parks the event in the table
			e.parkInTable(t)
		}

		// Relay A claims the row and stalls past its lease.
		now := e.ob.now()
		leaseA := now.Add(time.Minute)
		batch, err := r.claim(ctx, now, leaseA, []string{id}, 1)
		require.NoError(t, err)
		require.Len(t, batch, 1)
		e.clock.Advance(time.Minute + time.Second)

		// Relay B claims it again.
		now = e.ob.now()
		leaseB := now.Add(time.Minute)
		batch, err = r.claim(ctx, now, leaseB, []string{id}, 1)
		require.NoError(t, err)
		require.Len(t, batch, 1, "%s: the expired claim is claimed again", s.name)
		held := e.record(id)
		require.NotNil(t, held.LockedUntil)

		// A's late outcome must not touch the row B holds.
		require.NoError(t, s.write(ctx, id, leaseA), s.name)
		assert.Equal(t, held, e.record(id), "%s with an expired lease changed a row another relay holds", s.name)

		// B's outcome, under the lease that holds the row, applies.
		require.NoError(t, s.write(ctx, id, leaseB), s.name)
		rec := e.record(id)
		assert.NotEqual(t, held, rec, "%s with the live lease changed nothing", s.name)
		t.Run(s.name, func(t *testing.T) { s.check(t, rec) })
	}
}
