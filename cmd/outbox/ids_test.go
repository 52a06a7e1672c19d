package main

import (
	"testing"

	"github.com/gorm-outbox/outbox"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// statuses returns the status of each fixture event, "" for one the table
// no longer holds.
func (f *fixture) statuses(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, id := range []string{"ok-1", "ok-2", "bad-1", "bad-2", "wait-1"} {
		out[id] = ""
	}
	rows, err := f.ob.List(f.db.WithContext(t.Context()), outbox.ListParams{})
	require.NoError(t, err)
	for _, r := range rows {
		out[r.ID] = string(r.Status)
	}
	return out
}

// fixtureStatuses are the fixture's statuses as newFixture leaves them.
func fixtureStatuses() map[string]string {
	return map[string]string{"ok-1": "sent", "ok-2": "sent", "bad-1": "failed", "bad-2": "failed", "wait-1": "pending"}
}

// TestReplayUnknownID: an ID the table does not hold is "not found"
// (exit 4), not "nothing to do", and replays nothing else: dropping it
// from the selection must not leave a filter that matches every event.
func TestReplayUnknownID(t *testing.T) {
	forEach(t, func(t *testing.T, f *fixture) {
		for _, c := range []struct {
			id   string
			args []string
		}{
			{"nope", []string{"replay", "nope", "--yes"}},
			{"nope", []string{"replay", "--id", "nope", "--yes"}},
			{"nope", []string{"replay", "nope", "--id", "nope", "--yes"}}, // once each
			{"nope", []string{"replay", "nope", "--dry-run"}},
			{"nope", []string{"replay", "nope"}}, // nothing to confirm: no question asked
			{"nope", []string{"replay", "nope", "--type", "payment.captured", "--yes"}},
			{"BAD-1", []string{"replay", "BAD-1", "--yes"}}, // IDs compare byte for byte
		} {
			args := c.args
			code, out, errOut := f.run(t, "", args...)
			assert.Equal(t, exitNotFound, code, "%v: %s", args, errOut)
			assert.Equal(t, "outbox: event not found: "+c.id+"\n", errOut, "%v", args)
			assert.NotContains(t, out, "no failed events match", "%v", args)
			assert.Equal(t, fixtureStatuses(), f.statuses(t), "%v", args)
		}
	})
}

// TestReplayWrongStatus: a known event that is not failed says which
// status it has and exits 5, changing nothing.
func TestReplayWrongStatus(t *testing.T) {
	forEach(t, func(t *testing.T, f *fixture) {
		for _, c := range []struct{ id, status string }{{"ok-1", "sent"}, {"wait-1", "pending"}} {
			for _, args := range [][]string{{"replay", c.id, "--yes"}, {"replay", c.id, "--dry-run"}, {"replay", c.id}} {
				code, out, errOut := f.run(t, "", args...)
				assert.Equal(t, exitWrongStatus, code, "%v: %s", args, errOut)
				assert.Equal(t, "outbox: event "+c.id+" is "+c.status+"; replay changes only failed events\n", errOut, "%v", args)
				assert.Empty(t, out, "%v", args)
				assert.Equal(t, fixtureStatuses(), f.statuses(t), "%v", args)
			}
		}
	})
}

// TestReplaySeveralIDs: each unknown or wrong-status ID is reported
// (before the question, so the operator sees them when answering), the
// rest are replayed, and the exit status is the worst outcome: 4 over 5.
func TestReplaySeveralIDs(t *testing.T) {
	forEach(t, func(t *testing.T, f *fixture) {
		// A dry run reports the same and changes nothing.
		code, out, errOut := f.run(t, "", "replay", "bad-1", "ok-1", "nope", "--dry-run")
		assert.Equal(t, exitNotFound, code, errOut)
		assert.Equal(t, "outbox: event ok-1 is sent; replay changes only failed events\noutbox: event not found: nope\n", errOut)
		assert.Contains(t, out, "dry run: would replay 1 failed events")
		assert.Contains(t, out, "bad-1")
		assert.NotContains(t, out, "ok-1")
		assert.Equal(t, fixtureStatuses(), f.statuses(t))

		// Declined: an error (1) outranks the IDs' statuses.
		code, _, errOut = f.run(t, "n\n", "replay", "bad-1", "nope")
		assert.Equal(t, exitError, code, errOut)
		assert.Contains(t, errOut, "outbox: event not found: nope\nReplay 1 failed events in table "+f.table+"? [y/N]")
		assert.Contains(t, errOut, "not confirmed")
		assert.Equal(t, fixtureStatuses(), f.statuses(t))

		code, out, errOut = f.run(t, "y\n", "replay", "wait-1", "bad-1", "nope", "ok-1", "nope")
		assert.Equal(t, exitNotFound, code, errOut)
		assert.Equal(t, "outbox: event wait-1 is pending; replay changes only failed events\n"+
			"outbox: event not found: nope\n"+
			"outbox: event ok-1 is sent; replay changes only failed events\n"+
			"Replay 1 failed events in table "+f.table+"? [y/N] ", errOut, "each ID once, in the order given")
		assert.Equal(t, "replayed 1 events (pending again, due now)\n", out)
		want := fixtureStatuses()
		want["bad-1"] = "pending"
		assert.Equal(t, want, f.statuses(t))

		// Wrong status without an unknown ID: 5.
		code, out, errOut = f.run(t, "", "replay", "bad-2", "ok-2", "--yes")
		assert.Equal(t, exitWrongStatus, code, errOut)
		assert.Equal(t, "outbox: event ok-2 is sent; replay changes only failed events\n", errOut)
		assert.Equal(t, "replayed 1 events (pending again, due now)\n", out)
		want["bad-2"] = "pending"
		assert.Equal(t, want, f.statuses(t))

		// Every ID known and failed: 0, as before.
		require.NoError(t, f.db.Table(f.table).Where("named_id IN ?", []string{"bad-1", "bad-2"}).Update("status", "failed").Error)
		code, out, errOut = f.run(t, "", "replay", "bad-1", "bad-2", "bad-1", "--yes")
		assert.Equal(t, exitOK, code, errOut)
		assert.Empty(t, errOut)
		assert.Equal(t, "replayed 2 events (pending again, due now)\n", out)
	})
}

// TestPurgeUnknownID: as TestReplayUnknownID, for purge: nothing is
// deleted.
func TestPurgeUnknownID(t *testing.T) {
	forEach(t, func(t *testing.T, f *fixture) {
		for _, c := range []struct {
			id   string
			args []string
		}{
			{"nope", []string{"purge", "nope", "--yes"}},
			{"nope", []string{"purge", "--id", "nope", "--yes"}},
			{"nope", []string{"purge", "nope", "--id", "nope", "--yes"}},
			{"nope", []string{"purge", "nope", "--dry-run"}},
			{"nope", []string{"purge", "nope"}},
			{"nope", []string{"purge", "nope", "--older-than", "1ns", "--yes"}},
			{"OK-1", []string{"purge", "OK-1", "--yes"}},
		} {
			args := c.args
			code, out, errOut := f.run(t, "", args...)
			assert.Equal(t, exitNotFound, code, "%v: %s", args, errOut)
			assert.Equal(t, "outbox: event not found: "+c.id+"\n", errOut, "%v", args)
			assert.NotContains(t, out, "events match", "%v", args)
			assert.Equal(t, fixtureStatuses(), f.statuses(t), "%v", args)
		}
	})
}

// TestPurgeWrongStatus: a pending event is never deleted, and one the
// purge's statuses leave out (--status, or --older-than's sent) is named
// with its status; both exit 5.
func TestPurgeWrongStatus(t *testing.T) {
	forEach(t, func(t *testing.T, f *fixture) {
		for _, c := range []struct {
			args []string
			msg  string
		}{
			{[]string{"purge", "wait-1", "--yes"}, "event wait-1 is pending; purge never deletes pending events"},
			{[]string{"purge", "wait-1", "--dry-run"}, "event wait-1 is pending; purge never deletes pending events"},
			{[]string{"purge", "wait-1"}, "event wait-1 is pending; purge never deletes pending events"},
			{[]string{"purge", "bad-1", "--status", "sent", "--yes"}, "event bad-1 is failed; this purge deletes only sent events"},
			{[]string{"purge", "bad-1", "--older-than", "1ns", "--yes"}, "event bad-1 is failed; this purge deletes only sent events"},
			{[]string{"purge", "ok-1", "--status", "failed", "--yes"}, "event ok-1 is sent; this purge deletes only failed events"},
		} {
			code, out, errOut := f.run(t, "", c.args...)
			assert.Equal(t, exitWrongStatus, code, "%v: %s", c.args, errOut)
			assert.Equal(t, "outbox: "+c.msg+"\n", errOut, "%v", c.args)
			assert.Empty(t, out, "%v", c.args)
			assert.Equal(t, fixtureStatuses(), f.statuses(t), "%v", c.args)
		}
	})
}

// TestPurgeSeveralIDs: as TestReplaySeveralIDs, for purge.
func TestPurgeSeveralIDs(t *testing.T) {
	forEach(t, func(t *testing.T, f *fixture) {
		code, out, errOut := f.run(t, "", "purge", "ok-1", "wait-1", "nope", "--dry-run")
		assert.Equal(t, exitNotFound, code, errOut)
		assert.Equal(t, "outbox: event wait-1 is pending; purge never deletes pending events\noutbox: event not found: nope\n", errOut)
		assert.Contains(t, out, "dry run: would delete 1 sent and failed events")
		assert.Equal(t, fixtureStatuses(), f.statuses(t))

		code, _, errOut = f.run(t, "", "purge", "ok-1", "nope")
		assert.Equal(t, exitError, code, "no answer on stdin: %s", errOut)
		assert.Contains(t, errOut, "outbox: event not found: nope\nDelete 1 sent and failed events in table "+f.table+"? [y/N]")
		assert.Equal(t, fixtureStatuses(), f.statuses(t))

		code, out, errOut = f.run(t, "yes\n", "purge", "ok-1", "wait-1", "nope", "bad-1")
		assert.Equal(t, exitNotFound, code, errOut)
		assert.Equal(t, "outbox: event wait-1 is pending; purge never deletes pending events\n"+
			"outbox: event not found: nope\n"+
			"Delete 2 sent and failed events in table "+f.table+"? [y/N] ", errOut)
		assert.Equal(t, "deleted 2 events\n", out)
		want := fixtureStatuses()
		want["ok-1"], want["bad-1"] = "", ""
		assert.Equal(t, want, f.statuses(t))

		// A purged event is not found afterwards: 4 again, even though
		// the other event is deleted.
		code, out, errOut = f.run(t, "", "purge", "ok-1", "ok-2", "--yes")
		assert.Equal(t, exitNotFound, code, errOut)
		assert.Equal(t, "outbox: event not found: ok-1\n", errOut)
		assert.Equal(t, "deleted 1 events\n", out)
		want["ok-2"] = ""
		assert.Equal(t, want, f.statuses(t))

		code, out, errOut = f.run(t, "", "purge", "bad-2", "wait-1", "--yes")
		assert.Equal(t, exitWrongStatus, code, errOut)
		assert.Equal(t, "outbox: event wait-1 is pending; purge never deletes pending events\n", errOut)
		assert.Equal(t, "deleted 1 events\n", out)
		assert.Equal(t, map[string]string{"ok-1": "", "ok-2": "", "bad-1": "", "bad-2": "", "wait-1": "pending"}, f.statuses(t))
	})
}

// TestReplayPurgeExitStatusesDocumented: replay's and purge's -h say what
// 4 and 5 mean, as the help and the package doc do.
func TestReplayPurgeExitStatusesDocumented(t *testing.T) {
	t.Parallel()
	code, out, _ := runEnv(t, nil, "", "help")
	require.Equal(t, exitOK, code)
	assert.Contains(t, out, "5 a named event in a status the command does not act on")
	for _, cmd := range []string{"replay", "purge"} {
		code, _, errOut := runEnv(t, nil, "", cmd, "-h")
		require.Equal(t, exitOK, code)
		assert.Contains(t, errOut, "\nExit status:\n  0  ok", cmd)
		assert.Contains(t, errOut, "\n  4  an event ID not in the table\n", cmd)
		assert.Contains(t, errOut, "\n  5  a named event", cmd)
		assert.Contains(t, errOut, "the status is the worst:\n  1, then 4, then 5.\n", cmd)
	}
}
