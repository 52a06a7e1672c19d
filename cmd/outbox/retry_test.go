package main

import (
	"context"
	"errors"
	"os"
	"os/user"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/outboxtest"
)

// backoff adds to the fixture two events whose receiver answered 503, so
// that they wait 10 minutes for their retry (later-1, later-2 of type
// invoice.sent); wait-1, which has no handler, is attempted again and
// waits 10 minutes too.
func (f *fixture) backoff(t *testing.T) {
	t.Helper()
	f.ob.Handle("invoice.sent", func(context.Context, outbox.Event) error { return errors.New("503 from billing.example") })
	require.NoError(t, outbox.PublishAlone(f.db, outbox.Event{ID: "later-1", Type: "invoice.sent"}, outbox.Event{ID: "later-2", Type: "invoice.sent"}))
	db := f.db.WithContext(t.Context())
	_, err := f.ob.RetryNow(db, outbox.Filter{IDs: []string{"wait-1"}}) // due now, whatever its first backoff left
	require.NoError(t, err)
	outboxtest.Drain(t, outboxtest.Relay(t, f.ob, f.db, outbox.RelayConfig{Backoff: func(int) time.Duration { return 10 * time.Minute }}))
	for _, id := range []string{"later-1", "later-2", "wait-1"} {
		r, err := f.ob.Get(db, id)
		require.NoError(t, err)
		require.Equal(t, outbox.StatusPending, r.Status, id)
		require.True(t, r.AvailableAt.After(time.Now().Add(9*time.Minute)), "%s waits: %s", id, r.AvailableAt)
	}
}

func (f *fixture) row(t *testing.T, id string) outbox.Row {
	t.Helper()
	r, err := f.ob.Get(f.db.WithContext(t.Context()), id)
	require.NoError(t, err)
	return r
}

func (f *fixture) waitingNow(t *testing.T, id string) bool {
	return f.row(t, id).AvailableAt.After(time.Now())
}

// TestRetryNow: retry-now makes pending events waiting for a retry due
// now, by ID, filter or --all, through the same dry run and question as
// replay and purge, with the actor in each event's history.
func TestRetryNow(t *testing.T) {
	forEach(t, func(t *testing.T, f *fixture) {
		f.backoff(t)
		before := f.row(t, "later-1")

		// show says when, and how to make it sooner.
		code, out, errOut := f.run(t, "", "show", "later-1", "--no-payload")
		require.Equal(t, exitOK, code, errOut)
		assert.Regexp(t, `available at:\s+\S+ \(next attempt, in (9m5\ds|10m0s); outbox retry-now later-1 makes it due now\)\n`, out)
		code, out, _ = f.run(t, "", "show", "ok-1", "--no-payload")
		require.Equal(t, exitOK, code)
		assert.NotContains(t, out, "next attempt", "a sent event waits for nothing")

		// A dry run lists them and changes nothing.
		code, out, errOut = f.run(t, "", "retry-now", "--type", "invoice.sent", "--dry-run")
		require.Equal(t, exitOK, code, errOut)
		assert.Contains(t, out, "later-1")
		assert.Contains(t, out, "later-2")
		assert.NotContains(t, out, "wait-1", "another type")
		assert.Contains(t, out, "dry run: would retry now 2 pending events waiting for a retry in table "+f.table+" (of 2 pending matching); nothing changed\n")
		assert.Equal(t, before, f.row(t, "later-1"), "a dry run changes nothing")

		// The question, answered no, or not at all.
		code, _, errOut = f.run(t, "n\n", "retry-now", "--type", "invoice.sent")
		assert.Equal(t, exitError, code)
		assert.Contains(t, errOut, "Retry now 2 pending events waiting for a retry in table "+f.table+"? [y/N]")
		assert.Contains(t, errOut, "not confirmed")
		code, _, errOut = f.run(t, "", "retry-now", "--type", "invoice.sent")
		assert.Equal(t, exitError, code)
		assert.Contains(t, errOut, "pass --yes")
		assert.True(t, f.waitingNow(t, "later-1"), "nothing changed")

		// By ID, answered yes: due now, its attempts kept, the history says
		// who.
		code, out, errOut = f.run(t, "y\n", "retry-now", "later-1")
		require.Equal(t, exitOK, code, errOut)
		assert.Equal(t, "retried 1 events now (due now, attempts kept)\n", out)
		got := f.row(t, "later-1")
		assert.False(t, got.AvailableAt.After(time.Now()), "due now")
		assert.Equal(t, before.Attempts, got.Attempts, "attempts kept")
		assert.Equal(t, outbox.StatusPending, got.Status)
		assert.True(t, f.waitingNow(t, "later-2"), "only the event named")
		hist, err := f.ob.History(f.db.WithContext(t.Context()), "later-1")
		require.NoError(t, err)
		require.NotEmpty(t, hist)
		last := hist[len(hist)-1]
		assert.Equal(t, outbox.OutcomeRetried, last.Outcome)
		u, err := user.Current()
		require.NoError(t, err)
		host, _ := os.Hostname()
		assert.Equal(t, "outbox command: "+u.Username+"@"+host, last.Actor)

		// Named events it cannot retry: each said, the worst status.
		code, out, errOut = f.run(t, "", "retry-now", "later-1", "bad-1", "nope", "--yes")
		assert.Equal(t, exitNotFound, code, errOut)
		assert.Empty(t, out, "none left to retry")
		assert.Contains(t, errOut, "outbox: event later-1 is pending; it waits for no retry (due already, or being delivered now)\n")
		assert.Contains(t, errOut, "outbox: event bad-1 is failed; retry-now changes only pending events waiting for a retry\n")
		assert.Contains(t, errOut, "outbox: event not found: nope\n")
		code, out, errOut = f.run(t, "", "retry-now", "later-2", "ok-1", "--yes")
		assert.Equal(t, exitWrongStatus, code, errOut)
		assert.Equal(t, "retried 1 events now (due now, attempts kept)\n", out, "the others are retried")
		assert.False(t, f.waitingNow(t, "later-2"))

		// --all, with OUTBOX_ACTOR naming who.
		code, out, errOut = runEnv(t, map[string]string{"OUTBOX_DSN": f.dsn, "OUTBOX_TABLE": f.table, "OUTBOX_ACTOR": "alice@example.com"}, "", "retry-now", "--all", "--yes")
		require.Equal(t, exitOK, code, errOut)
		assert.Equal(t, "retried 1 events now (due now, attempts kept)\n", out, "wait-1, the one left")
		hist, err = f.ob.History(f.db.WithContext(t.Context()), "wait-1")
		require.NoError(t, err)
		assert.Equal(t, "alice@example.com", hist[len(hist)-1].Actor)
		code, out, _ = f.run(t, "", "retry-now", "--all", "--yes")
		require.Equal(t, exitOK, code)
		assert.Equal(t, "no pending events waiting for a retry match (3 pending, due already or being delivered)\n", out)

		// Usage.
		code, _, errOut = f.run(t, "", "retry-now")
		assert.Equal(t, exitUsage, code)
		assert.Contains(t, errOut, "retry-now needs event IDs, a filter (--type, --error, --since, ...) or --all")
		code, _, errOut = f.run(t, "", "retry-now", "--status", "failed", "--all")
		assert.Equal(t, exitUsage, code)
		assert.Contains(t, errOut, "retry-now changes only pending events waiting for a retry; --status failed leaves them out")
	})
}

// TestReplayActor: replay records who in each event's history too.
func TestReplayActor(t *testing.T) {
	forEach(t, func(t *testing.T, f *fixture) {
		code, _, errOut := runEnv(t, map[string]string{"OUTBOX_DSN": f.dsn, "OUTBOX_TABLE": f.table, "OUTBOX_ACTOR": "bob"}, "", "replay", "bad-1", "--yes")
		require.Equal(t, exitOK, code, errOut)
		hist, err := f.ob.History(f.db.WithContext(t.Context()), "bad-1")
		require.NoError(t, err)
		require.NotEmpty(t, hist)
		assert.Equal(t, outbox.OutcomeReplayed, hist[len(hist)-1].Outcome)
		assert.Equal(t, "bob", hist[len(hist)-1].Actor)
	})
}

func TestRetryNowExitStatusesDocumented(t *testing.T) {
	t.Parallel()
	code, out, _ := runEnv(t, nil, "", "help")
	require.Equal(t, exitOK, code)
	assert.Contains(t, out, "outbox retry-now [ID...] [filters] [--all] [--dry-run] [--yes]")
	code, _, errOut := runEnv(t, nil, "", "retry-now", "-h")
	require.Equal(t, exitOK, code)
	assert.Contains(t, errOut, "Usage: outbox retry-now [ID...] [filters] [--all] [--dry-run] [--yes]")
	assert.Contains(t, errOut, "\nExit status:\n  0  ok")
	assert.Contains(t, errOut, "\n  4  an event ID not in the table\n")
	assert.Contains(t, errOut, "\n  5  a named event that waits for no retry")
	assert.Contains(t, errOut, "the status is the worst:\n  1, then 4, then 5.\n")
	for _, flag := range []string{"-dry-run", "-yes", "-all", "-type", "-error"} {
		assert.Regexp(t, regexp.MustCompile(`\n  `+flag+`\b`), errOut)
	}
}

func TestSuggest(t *testing.T) {
	t.Parallel()
	names := []string{"list", "migrate", "purge", "replay", "retry-now", "show", "stats", "ui", "version"}
	for typed, want := range map[string]string{
		"status": "stats", "statss": "stats", "lits": "list", "ui": "ui", "uo": "ui", "retry": "retry-now", "ver": "version",
		"xyz": "", "": "", "delete": "", "ls": "", "purgeall": "",
	} {
		assert.Equal(t, want, suggest(typed, names), "%q", typed)
	}
	assert.Equal(t, 1, editDistance("status", "stats"))
	assert.Equal(t, 1, editDistance("lsit", "list"), "a swap is one edit")
	assert.Equal(t, 3, editDistance("kitten", "sitting"))
}
