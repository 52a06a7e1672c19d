package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	mysqldriver "github.com/go-sql-driver/mysql"
	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/outboxtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/driver/mysql"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// backend is one database the command's tests run on. Each test gets a
// table of its own, so tests run in parallel on one database.
type backend struct {
	name string
	// dsn returns the DSN of a database for one test; "" skips.
	dsn  func(t *testing.T) string
	skip string
}

const (
	postgresDSNEnv = "OUTBOX_TEST_POSTGRES_DSN"
	mysqlDSNEnv    = "OUTBOX_TEST_MYSQL_DSN"
)

func backends() []backend {
	bs := []backend{{name: "sqlite", dsn: func(t *testing.T) string {
		return "file:" + filepath.Join(t.TempDir(), "app.db") + outbox.SQLiteDSNOptions
	}}}
	for _, b := range []struct{ name, env string }{{"postgres", postgresDSNEnv}, {"mysql", mysqlDSNEnv}} {
		dsn := os.Getenv(b.env)
		be := backend{name: b.name, dsn: func(*testing.T) string { return dsn }}
		if dsn == "" {
			be.skip = b.env + " is not set"
		}
		bs = append(bs, be)
	}
	return bs
}

// forEach runs fn on every backend, in parallel.
func forEach(t *testing.T, fn func(t *testing.T, f *fixture)) {
	t.Parallel()
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			if b.skip != "" {
				t.Skip(b.skip)
			}
			fn(t, newFixture(t, b))
		})
	}
}

// fixture is a database with an outbox table of its own, holding:
//
//	ok-1, ok-2      order.created     sent
//	bad-1, bad-2    payment.captured  failed ("card DECLINED by issuer")
//	wait-1          order.shipped     pending (no handler)
type fixture struct {
	name, dsn, table string
	db               *gorm.DB
	ob               *outbox.Outbox
}

func newFixture(t *testing.T, b backend) *fixture {
	t.Helper()
	dsn := b.dsn(t)
	raw := make([]byte, 5)
	_, _ = rand.Read(raw)
	f := &fixture{name: b.name, dsn: dsn, table: "cli_" + hex.EncodeToString(raw)}
	dial, name, err := dialector(dsn, true)
	require.NoError(t, err)
	require.Equal(t, b.name, name)
	f.db, err = gorm.Open(dial, &gorm.Config{Logger: logger.Discard})
	require.NoError(t, err)
	f.ob = outbox.Plugin(outbox.Config{Table: f.table, Logger: slog.New(slog.DiscardHandler), DisableNotify: true})
	require.NoError(t, f.db.Use(f.ob))
	t.Cleanup(func() {
		_ = f.db.Migrator().DropTable(f.table)
		if sqlDB, err := f.db.DB(); err == nil {
			_ = sqlDB.Close()
		}
	})

	f.ob.Handle("order.created", func(context.Context, outbox.Event) error { return nil })
	f.ob.Handle("payment.captured", func(context.Context, outbox.Event) error {
		return outbox.Permanent(errors.New("card DECLINED by issuer"))
	})
	var events []outbox.Event
	for _, id := range []string{"ok-1", "ok-2"} {
		events = append(events, outbox.Event{ID: id, Type: "order.created", AggregateType: "order", AggregateID: id, Payload: map[string]string{"id": id}})
	}
	for _, id := range []string{"bad-1", "bad-2"} {
		events = append(events, outbox.Event{ID: id, Type: "payment.captured", Payload: map[string]any{"card": "4242", "amount": 12}})
	}
	events = append(events, outbox.Event{ID: "wait-1", Type: "order.shipped", Payload: 1})
	require.NoError(t, outbox.PublishAlone(f.db, events...))
	_, err = outboxtest.Relay(t, f.ob, f.db, outbox.RelayConfig{}).ProcessOnce(t.Context())
	require.NoError(t, err)
	return f
}

// run runs the command with OUTBOX_DSN and OUTBOX_TABLE naming the
// fixture's table.
func (f *fixture) run(t *testing.T, stdin string, args ...string) (int, string, string) {
	t.Helper()
	return runEnv(t, map[string]string{"OUTBOX_DSN": f.dsn, "OUTBOX_TABLE": f.table}, stdin, args...)
}

func runEnv(t *testing.T, env map[string]string, stdin string, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := run(t.Context(), args, strings.NewReader(stdin), &out, &errOut, func(k string) string { return env[k] })
	return code, out.String(), errOut.String()
}

func (f *fixture) status(t *testing.T, id string) outbox.Status {
	t.Helper()
	r, err := f.ob.Get(f.db.WithContext(t.Context()), id)
	require.NoError(t, err)
	return r.Status
}

func (f *fixture) ids(t *testing.T, fl outbox.Filter) []string {
	t.Helper()
	rows, err := f.ob.List(f.db.WithContext(t.Context()), outbox.ListParams{Filter: fl})
	require.NoError(t, err)
	var out []string
	for _, r := range rows {
		out = append(out, r.ID)
	}
	return out
}

// jsonLines decodes --json output, one object per line.
func jsonLines(t *testing.T, out string) []map[string]any {
	t.Helper()
	var rows []map[string]any
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		var m map[string]any
		require.NoError(t, json.Unmarshal(sc.Bytes(), &m), "line %q", sc.Text())
		rows = append(rows, m)
	}
	return rows
}

func idsOf(rows []map[string]any) []string {
	var out []string
	for _, r := range rows {
		out = append(out, r["id"].(string))
	}
	return out
}

func TestStats(t *testing.T) {
	forEach(t, func(t *testing.T, f *fixture) {
		code, out, errOut := f.run(t, "", "stats")
		require.Equal(t, exitOK, code, errOut)
		assert.Contains(t, out, "pending           1\n")
		assert.NotContains(t, out, "sent", "Stats reads no sent rows")
		assert.Contains(t, out, "failed            2\n")
		assert.Contains(t, out, "failed last hour  2\n")

		code, _, errOut = f.run(t, "", "stats", "--max-failed", "1")
		assert.Equal(t, exitCheck, code)
		assert.Contains(t, errOut, "CHECK FAILED: 2 events are failed (limit 1)")
		code, _, _ = f.run(t, "", "stats", "--max-failed", "2")
		assert.Equal(t, exitOK, code)
		code, _, errOut = f.run(t, "", "stats", "--max-failed-last-hour", "0")
		assert.Equal(t, exitCheck, code)
		assert.Contains(t, errOut, "2 events failed in the last hour (limit 0)")

		code, _, _ = f.run(t, "", "stats", "--max-pending-age", "1h")
		assert.Equal(t, exitOK, code, "the pending event is seconds old")
		// The pending event is older than a nanosecond by the time stats
		// reads it.
		code, _, errOut = f.run(t, "", "stats", "--max-pending-age", "1ns")
		assert.Equal(t, exitCheck, code)
		assert.Contains(t, errOut, "the oldest pending event is")
		code, _, errOut = f.run(t, "", "stats", "--max-pending-age", "soon")
		assert.Equal(t, exitUsage, code, errOut)

		code, out, errOut = f.run(t, "", "stats", "--json", "--max-failed", "5")
		require.Equal(t, exitOK, code, errOut)
		var st map[string]any
		require.NoError(t, json.Unmarshal([]byte(out), &st))
		assert.EqualValues(t, 1, st["pending"])
		assert.EqualValues(t, 2, st["failed"])
		assert.EqualValues(t, 2, st["failed_last_hour"])
		assert.Greater(t, st["oldest_pending_seconds"], 0.0)
		assert.Less(t, st["oldest_pending_seconds"], 3600.0)

		// No relay runs: the relay checks fail, on every database.
		code, out, errOut = f.run(t, "", "stats", "--min-relays", "1", "--max-relay-silence", "1m")
		assert.Equal(t, exitCheck, code)
		assert.Contains(t, out, "relays            0\n")
		assert.Contains(t, errOut, "0 relays serve the table (at least 1 wanted)")
		assert.Contains(t, errOut, "no relay has recorded itself for never (limit 1m0s)")
		// A relay that runs records itself at once.
		ctx, stop := context.WithCancel(t.Context())
		ran := make(chan error, 1)
		go func() { ran <- outboxtest.Relay(t, f.ob, f.db, outbox.RelayConfig{Name: "on-call"}).Run(ctx) }()
		require.Eventually(t, func() bool {
			code, _, _ := f.run(t, "", "stats", "--min-relays", "1", "--max-relay-silence", "1m")
			return code == exitOK
		}, 10*time.Second, 20*time.Millisecond, "the running relay meets both checks")
		code, out, errOut = f.run(t, "", "stats", "--min-relays", "2")
		assert.Equal(t, exitCheck, code, errOut)
		assert.Contains(t, out, "relays            1\n")
		assert.Regexp(t, `\n  on-call  \S+ pid \d+, persistent, up `, out)
		code, out, errOut = f.run(t, "", "stats", "--json")
		require.Equal(t, exitOK, code, errOut)
		require.NoError(t, json.Unmarshal([]byte(out), &st))
		if assert.Len(t, st["relays"], 1) {
			assert.Equal(t, "on-call", st["relays"].([]any)[0].(map[string]any)["name"])
		}
		stop()
		require.NoError(t, <-ran)

		// Nothing failed, nothing pending: every check passes.
		_, err := f.ob.Purge(f.db.WithContext(t.Context()), outbox.Filter{Statuses: []outbox.Status{outbox.StatusFailed}})
		require.NoError(t, err)
		require.NoError(t, f.db.Table(f.table).Where("named_id = ?", "wait-1").Delete(nil).Error)
		code, out, errOut = f.run(t, "", "stats", "--max-failed", "0", "--max-pending-age", "1ns", "--max-failed-last-hour", "0")
		assert.Equal(t, exitOK, code, errOut)
		assert.Contains(t, out, "oldest pending    -\n")
	})
}

func TestList(t *testing.T) {
	forEach(t, func(t *testing.T, f *fixture) {
		code, out, errOut := f.run(t, "", "list", "--json")
		require.Equal(t, exitOK, code, errOut)
		assert.Equal(t, []string{"wait-1", "bad-2", "bad-1", "ok-2", "ok-1"}, idsOf(jsonLines(t, out)), "newest first, as the dashboard")
		code, out, errOut = f.run(t, "", "list", "--json", "--oldest")
		require.Equal(t, exitOK, code, errOut)
		rows := jsonLines(t, out)
		assert.Equal(t, []string{"ok-1", "ok-2", "bad-1", "bad-2", "wait-1"}, idsOf(rows))
		assert.NotContains(t, rows[0], "payload", "payloads only on request")
		assert.Equal(t, "sent", rows[0]["status"])
		assert.NotNil(t, rows[0]["sent_at"])
		created, err := time.Parse(time.RFC3339Nano, rows[0]["created_at"].(string))
		require.NoError(t, err)
		assert.WithinDuration(t, time.Now(), created, time.Minute, "times are UTC instants, not shifted by a zone")
		assert.True(t, strings.HasSuffix(rows[0]["created_at"].(string), "Z"))

		code, out, _ = f.run(t, "", "list", "--json", "--payload", "--id", "bad-1")
		require.Equal(t, exitOK, code)
		rows = jsonLines(t, out)
		require.Len(t, rows, 1)
		assert.Equal(t, map[string]any{"amount": 12.0, "card": "4242"}, rows[0]["payload"])
		assert.Equal(t, "card DECLINED by issuer (permanent)", rows[0]["last_error"])

		for _, c := range []struct {
			args []string
			want []string // oldest first
		}{
			{[]string{"--status", "failed"}, []string{"bad-1", "bad-2"}},
			{[]string{"--status", "sent", "--status", "pending"}, []string{"ok-1", "ok-2", "wait-1"}},
			{[]string{"--type", "order.created,order.shipped"}, []string{"ok-1", "ok-2", "wait-1"}},
			{[]string{"--aggregate-type", "order", "--aggregate-id", "ok-2"}, []string{"ok-2"}},
			{[]string{"--error", "declined"}, []string{"bad-1", "bad-2"}},
			{[]string{"--since", "1h"}, []string{"ok-1", "ok-2", "bad-1", "bad-2", "wait-1"}},
			{[]string{"--until", "1h"}, nil},
			{[]string{"--until", "2099-01-01", "--since", "2000-01-01T00:00:00Z"}, []string{"ok-1", "ok-2", "bad-1", "bad-2", "wait-1"}},
		} {
			code, out, errOut := f.run(t, "", append([]string{"list", "--json", "--oldest"}, c.args...)...)
			require.Equal(t, exitOK, code, "%v: %s", c.args, errOut)
			assert.Equal(t, c.want, idsOf(jsonLines(t, out)), "%v", c.args)
			code, out, errOut = f.run(t, "", append([]string{"list", "--json"}, c.args...)...)
			require.Equal(t, exitOK, code, "%v: %s", c.args, errOut)
			newest := slices.Clone(c.want)
			slices.Reverse(newest)
			assert.Equal(t, newest, idsOf(jsonLines(t, out)), "%v, newest first", c.args)
		}
		code, out, _ = f.run(t, "", "list", "--json", "--newest", "--limit", "2")
		require.Equal(t, exitOK, code)
		assert.Equal(t, []string{"wait-1", "bad-2"}, idsOf(jsonLines(t, out)), "--newest, the default, still works")
		for _, args := range [][]string{{"--oldest", "--newest"}, {"--newest", "--after", "3"}, {"--oldest", "--before", "3"}, {"--after", "1", "--before", "3"}} {
			code, _, errOut = f.run(t, "", append([]string{"list"}, args...)...)
			assert.Equal(t, exitUsage, code, "%v: %s", args, errOut)
		}

		// Paging: every row once, in order, following the hint, both ways.
		for _, c := range []struct {
			order []string
			hint  string
			want  []string
		}{
			{nil, "--before", []string{"wait-1", "bad-2", "bad-1", "ok-2", "ok-1"}},
			{[]string{"--oldest"}, "--after", []string{"ok-1", "ok-2", "bad-1", "bad-2", "wait-1"}},
		} {
			var got []string
			first := append([]string{"list", "--json", "--limit", "2"}, c.order...)
			args := first
			for range 5 {
				code, out, errOut := f.run(t, "", args...)
				require.Equal(t, exitOK, code, errOut)
				rows := jsonLines(t, out)
				got = append(got, idsOf(rows)...)
				if !strings.Contains(errOut, c.hint) {
					break
				}
				next := strings.TrimSuffix(strings.TrimSpace(errOut[strings.Index(errOut, c.hint):]), ")")
				args = append([]string{"list", "--json", "--limit", "2"}, strings.Fields(next)...)
				assert.Equal(t, fmt.Sprintf("%s %v", c.hint, rows[len(rows)-1]["seq"]), next)
			}
			assert.Equal(t, c.want, got, "%v", c.order)
		}

		// The table for people: the last error's cause at a glance.
		code, out, _ = f.run(t, "", "list", "--status", "failed")
		require.Equal(t, exitOK, code)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		require.Len(t, lines, 3)
		assert.Regexp(t, `^SEQ\s+ID\s+STATUS\s+TYPE\s+AGGREGATE\s+ATTEMPTS\s+CREATED \(UTC\)\s+LAST ERROR$`, lines[0])
		assert.Regexp(t, `^\d+\s+bad-2\s+failed\s+payment.captured\s+1\s+\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ\s+card DECLINED by issuer \(permanent\)$`, lines[1])
		// An error of the old form, the event's ID first: the ID is left
		// out (the ID column has it), and the cause shows.
		id := "0193a4c2-7f3e-7b1a-9c2d-5e6f7a8b9c0d"
		require.NoError(t, outbox.PublishAlone(f.db, outbox.Event{ID: id, Type: "webhook.order"}))
		old := "permanent: outbox/webhook: deliver event " + id + " to hooks.example.com: 410 Gone\nthe endpoint was removed"
		require.NoError(t, f.db.Exec("UPDATE "+f.table+" SET status = 'failed', last_error = ? WHERE named_id = ?", old, id).Error)
		code, out, _ = f.run(t, "", "list", "--id", id)
		require.Equal(t, exitOK, code)
		assert.Contains(t, out, "permanent: outbox/webhook: deliver this event to hooks.example.com: 410 Gone…\n")
		assert.Equal(t, 1, strings.Count(out, id), "the ID once, in its column")

		code, _, errOut = f.run(t, "", "list", "--status", "stuck")
		assert.Equal(t, exitUsage, code)
		assert.Contains(t, errOut, `unknown status "stuck" (use pending, sent or failed)`)
		code, _, errOut = f.run(t, "", "list", "--since", "yesterday")
		assert.Equal(t, exitUsage, code)
		assert.Contains(t, errOut, "--since")
		code, _, _ = f.run(t, "", "list", "--limit", "5000")
		assert.Equal(t, exitUsage, code)
	})
}

func TestShow(t *testing.T) {
	forEach(t, func(t *testing.T, f *fixture) {
		code, out, errOut := f.run(t, "", "show", "bad-1")
		require.Equal(t, exitOK, code, errOut)
		assert.Contains(t, out, "id:               bad-1\n")
		assert.Contains(t, out, "status:           failed\n")
		assert.Contains(t, out, "last error:       card DECLINED by issuer (permanent)\n")
		assert.Contains(t, out, "sent at:          -\n")
		// Pretty-printed (PostgreSQL's jsonb orders keys its own way).
		assert.Regexp(t, `payload:\n  \{\n    "(amount": 12,\n    "card": "4242"|card": "4242",\n    "amount": 12)\n  \}\n$`, out)
		assert.Contains(t, out, "aggregate:        -\n")

		code, out, _ = f.run(t, "", "show", "--no-payload", "bad-1")
		require.Equal(t, exitOK, code)
		assert.NotContains(t, out, "4242")
		assert.Regexp(t, `payload:\s+\(hidden, \d+ bytes\)`, out)
		code, out, _ = f.run(t, "", "show", "bad-1", "--no-payload", "--json")
		require.Equal(t, exitOK, code)
		assert.NotContains(t, out, "4242")
		assert.Contains(t, out, `"id":"bad-1"`)

		// An unknown ID has an exit status of its own, which scripts can
		// tell from a database error; so does one whose case differs
		// (IDs compare byte for byte on every database).
		for _, args := range [][]string{{"show", "nope"}, {"show", "nope", "--json"}, {"show", "BAD-1"}} {
			code, out, errOut = f.run(t, "", args...)
			assert.Equal(t, exitNotFound, code, "%v", args)
			assert.Equal(t, "outbox: event not found: "+args[1]+"\n", errOut, "%v", args)
			assert.Empty(t, out, "%v", args)
		}
		code, _, _ = f.run(t, "", "show")
		assert.Equal(t, exitUsage, code)

		// User data cannot drive the terminal: escape sequences and
		// bidirectional overrides are printed escaped.
		require.NoError(t, outbox.PublishAlone(f.db, outbox.Event{ID: "esc", Type: "x", AggregateID: "a\x1b[2Jb\u202e",
			Payload: map[string]string{"s": "\u009b31m"}}))
		code, out, _ = f.run(t, "", "show", "esc")
		require.Equal(t, exitOK, code)
		assert.NotContains(t, out, "\x1b")
		assert.NotContains(t, out, "\u009b")
		assert.NotContains(t, out, "\u202e")
		assert.Contains(t, out, `a\u001b[2Jb\u202e`)
		code, out, _ = f.run(t, "", "list", "--id", "esc")
		require.Equal(t, exitOK, code)
		assert.NotContains(t, out, "\x1b")
	})
}

func TestReplay(t *testing.T) {
	forEach(t, func(t *testing.T, f *fixture) {
		ctx := t.Context()
		before, err := f.ob.Get(f.db.WithContext(ctx), "bad-1")
		require.NoError(t, err)

		code, out, errOut := f.run(t, "", "replay", "--dry-run", "--type", "payment.captured")
		require.Equal(t, exitOK, code, errOut)
		assert.Contains(t, out, "dry run: would replay 2 failed events in table "+f.table+"; nothing changed")
		assert.Contains(t, out, "bad-1")
		assert.Contains(t, out, "bad-2")
		after, err := f.ob.Get(f.db.WithContext(ctx), "bad-1")
		require.NoError(t, err)
		assert.Equal(t, before, after, "a dry run changes nothing")
		assert.Equal(t, []string{"bad-1", "bad-2"}, f.ids(t, outbox.Filter{Statuses: []outbox.Status{outbox.StatusFailed}}))

		// The question, answered no, or not at all.
		code, _, errOut = f.run(t, "n\n", "replay", "bad-1")
		assert.Equal(t, exitError, code)
		assert.Contains(t, errOut, "Replay 1 failed events in table "+f.table+"? [y/N]")
		assert.Contains(t, errOut, "not confirmed")
		assert.Equal(t, outbox.StatusFailed, f.status(t, "bad-1"))
		code, _, errOut = f.run(t, "", "replay", "bad-1")
		assert.Equal(t, exitError, code)
		assert.Contains(t, errOut, "pass --yes")
		assert.Equal(t, outbox.StatusFailed, f.status(t, "bad-1"))

		code, out, errOut = f.run(t, "yes\n", "replay", "bad-1", "ok-1")
		require.Equal(t, exitWrongStatus, code, "ok-1 is sent: %s", errOut)
		assert.Contains(t, errOut, "event ok-1 is sent; replay changes only failed events")
		assert.Contains(t, out, "replayed 1 events")
		r, err := f.ob.Get(f.db.WithContext(ctx), "bad-1")
		require.NoError(t, err)
		assert.Equal(t, outbox.StatusPending, r.Status)
		assert.Equal(t, 0, r.Attempts)
		assert.Equal(t, outbox.StatusFailed, f.status(t, "bad-2"))
		assert.Equal(t, outbox.StatusSent, f.status(t, "ok-1"), "only failed events are replayed")

		code, out, _ = f.run(t, "", "replay", "--error", "declined", "--yes")
		require.Equal(t, exitOK, code)
		assert.Contains(t, out, "replayed 1 events")
		code, out, _ = f.run(t, "", "replay", "--all", "--yes")
		require.Equal(t, exitOK, code)
		assert.Contains(t, out, "no failed events match")

		code, _, errOut = f.run(t, "", "replay")
		assert.Equal(t, exitUsage, code)
		assert.Contains(t, errOut, "replay needs event IDs")
		code, _, _ = f.run(t, "", "replay", "--status", "sent", "ok-1")
		assert.Equal(t, exitUsage, code)
	})
}

// storedTime is t as the library writes it on each database.
func storedTime(name string, t time.Time) any {
	switch name {
	case "sqlite":
		return t.UTC().Format("2006-01-02 15:04:05.999999999-07:00")
	case "mysql":
		return t.UTC().Format("2006-01-02 15:04:05.000000")
	}
	return t
}

func TestPurge(t *testing.T) {
	forEach(t, func(t *testing.T, f *fixture) {
		// ok-1 was created 40 days ago.
		require.NoError(t, f.db.Table(f.table).Where("named_id = ?", "ok-1").
			Update("created_at", storedTime(f.name, time.Now().Add(-40*24*time.Hour))).Error)

		code, out, errOut := f.run(t, "", "purge", "--older-than", "30d", "--dry-run")
		require.Equal(t, exitOK, code, errOut)
		assert.Contains(t, out, "dry run: would delete 1 sent events")
		assert.Contains(t, out, "ok-1")
		assert.Len(t, f.ids(t, outbox.Filter{}), 5, "a dry run deletes nothing")

		code, out, errOut = f.run(t, "", "purge", "--older-than", "30d", "--yes")
		require.Equal(t, exitOK, code, errOut)
		assert.Contains(t, out, "deleted 1 events")
		assert.Equal(t, []string{"ok-2", "bad-1", "bad-2", "wait-1"}, f.ids(t, outbox.Filter{}))

		// A poison event, by ID; a pending one is never deleted.
		code, out, errOut = f.run(t, "y\n", "purge", "bad-1", "wait-1")
		require.Equal(t, exitWrongStatus, code, "wait-1 is pending: %s", errOut)
		assert.Contains(t, out, "deleted 1 events")
		code, out, errOut = f.run(t, "", "purge", "wait-1", "--yes")
		require.Equal(t, exitWrongStatus, code)
		assert.Contains(t, errOut, "event wait-1 is pending; purge never deletes pending events")
		assert.Empty(t, out)
		assert.Equal(t, []string{"ok-2", "bad-2", "wait-1"}, f.ids(t, outbox.Filter{}))

		code, _, errOut = f.run(t, "", "purge", "--status", "pending", "--yes")
		assert.Equal(t, exitUsage, code)
		assert.Contains(t, errOut, "never deletes pending")
		code, _, _ = f.run(t, "", "purge", "--yes")
		assert.Equal(t, exitUsage, code, "no selection")
		code, _, _ = f.run(t, "n\n", "purge", "--all")
		assert.Equal(t, exitError, code)
		assert.Len(t, f.ids(t, outbox.Filter{}), 3)

		code, out, _ = f.run(t, "", "purge", "--status", "failed", "--until", "2099-01-01", "--yes")
		require.Equal(t, exitOK, code)
		assert.Contains(t, out, "deleted 1 events")
		assert.Equal(t, []string{"ok-2", "wait-1"}, f.ids(t, outbox.Filter{}))
	})
}

func TestMigrate(t *testing.T) {
	forEach(t, func(t *testing.T, f *fixture) {
		raw := make([]byte, 4)
		_, _ = rand.Read(raw)
		table := "mig_" + hex.EncodeToString(raw)
		t.Cleanup(func() { _ = f.db.Migrator().DropTable(table) })
		env := map[string]string{"OUTBOX_DSN": f.dsn}

		code, out, errOut := runEnv(t, env, "", "migrate", "--print-sql", "--table", table)
		require.Equal(t, exitOK, code, errOut)
		assert.Contains(t, out, "CREATE TABLE IF NOT EXISTS")
		assert.Contains(t, out, table)
		assert.NotContains(t, out, "up to date")
		assert.False(t, f.db.Migrator().HasTable(table), "--print-sql changes nothing")

		code, _, errOut = runEnv(t, env, "", "stats", "--table", table)
		assert.Equal(t, exitError, code)
		assert.Contains(t, errOut, fmt.Sprintf("database has no table %q: create it with \"outbox migrate\"", table))

		code, out, errOut = runEnv(t, env, "", "migrate", "--table", table)
		require.Equal(t, exitOK, code, errOut)
		assert.Equal(t, "created table "+table+"\n", out)
		code, out, _ = runEnv(t, env, "", "stats", "--table", table)
		require.Equal(t, exitOK, code)
		assert.Contains(t, out, "pending           0\n")
		code, out, _ = runEnv(t, env, "", "migrate", "--table", table)
		require.Equal(t, exitOK, code)
		assert.Contains(t, out, "up to date")
		code, out, _ = runEnv(t, env, "", "migrate", "--table", table, "--print-sql")
		require.Equal(t, exitOK, code)
		assert.Contains(t, out, "exists and is up to date")
	})
}

func TestMigratePrintSQLWithoutDatabase(t *testing.T) {
	t.Parallel()
	for _, d := range []string{"postgres", "mysql", "sqlite"} {
		want, err := outbox.SchemaSQL(d, "events")
		require.NoError(t, err)
		code, out, errOut := runEnv(t, nil, "", "migrate", "--print-sql", "--dialect", d, "--table", "events")
		require.Equal(t, exitOK, code, errOut)
		assert.Equal(t, strings.TrimSpace(want)+"\n", out)
	}
	code, _, _ := runEnv(t, nil, "", "migrate", "--print-sql", "--dialect", "oracle")
	assert.Equal(t, exitUsage, code)
	code, _, _ = runEnv(t, nil, "", "migrate", "--print-sql")
	assert.Equal(t, exitUsage, code)
}

func TestErrors(t *testing.T) {
	t.Parallel()
	code, _, errOut := runEnv(t, nil, "", "stats")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, errOut, "no database: pass --dsn or set OUTBOX_DSN")

	code, _, errOut = runEnv(t, nil, "", "stats", "--dsn", "s3cret-nonsense")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, errOut, "cannot tell the database from the DSN")
	assert.NotContains(t, errOut, "s3cret", "a DSN may hold a password")

	code, _, errOut = runEnv(t, nil, "", "stats", "--dsn", "postgres://postgres:s3cret@127.0.0.1:1/test?sslmode=disable&connect_timeout=5")
	assert.Equal(t, exitError, code)
	assert.Contains(t, errOut, "cannot connect to the postgres database")
	assert.NotContains(t, errOut, "s3cret")

	code, _, errOut = runEnv(t, nil, "", "stats", "--dsn", "root:s3cret@tcp(127.0.0.1:1)/test")
	assert.Equal(t, exitError, code)
	assert.Contains(t, errOut, "cannot connect to the mysql database")
	assert.NotContains(t, errOut, "s3cret")

	missing := filepath.Join(t.TempDir(), "typo.db")
	code, _, errOut = runEnv(t, nil, "", "list", "--dsn", missing)
	assert.Equal(t, exitError, code)
	assert.Contains(t, errOut, "SQLite database file "+missing+" does not exist")
	_, err := os.Stat(missing)
	assert.True(t, os.IsNotExist(err), "a mistyped path is not created")

	code, _, errOut = runEnv(t, nil, "", "stats", "--dsn", missing, "--table", "x; DROP TABLE y")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, errOut, "not a plain SQL identifier")

	code, _, errOut = runEnv(t, nil, "", "frobnicate")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, errOut, "outbox: unknown command \"frobnicate\"\n", "nothing near enough to suggest")
	for typed, meant := range map[string]string{"status": "stats", "stat": "stats", "lsit": "list", "replya": "replay",
		"retry": "retry-now", "retrynow": "retry-now", "prge": "purge", "migarte": "migrate", "verison": "version", "shwo": "show", "Stats": "stats"} {
		code, _, errOut = runEnv(t, nil, "", typed)
		assert.Equal(t, exitUsage, code, typed)
		assert.Contains(t, errOut, "outbox: unknown command \""+typed+"\"; did you mean "+meant+"?\n", typed)
	}
	for _, typed := range []string{"ls", "x", "dump", "rm"} {
		_, _, errOut = runEnv(t, nil, "", typed)
		assert.NotContains(t, errOut, "did you mean", "%s is near nothing", typed)
	}
	code, _, _ = runEnv(t, nil, "")
	assert.Equal(t, exitUsage, code)
	code, out, _ := runEnv(t, nil, "", "help")
	assert.Equal(t, exitOK, code)
	assert.Contains(t, out, "outbox replay")
	code, _, errOut = runEnv(t, map[string]string{"OUTBOX_DSN": "postgres://u:s3cret@h/db"}, "", "list", "-h")
	assert.Equal(t, exitOK, code)
	assert.Contains(t, errOut, "-aggregate-id")
	assert.NotContains(t, errOut, "s3cret", "help does not print the DSN from the environment")
	code, _, _ = runEnv(t, nil, "", "stats", "--bogus")
	assert.Equal(t, exitUsage, code)
}

// TestMissingTable: every command that reads the table says how to create
// it.
func TestMissingTable(t *testing.T) {
	forEach(t, func(t *testing.T, f *fixture) {
		for _, args := range [][]string{{"stats"}, {"list"}, {"show", "x"}, {"replay", "--all", "--yes"}, {"purge", "--all", "--yes"}} {
			code, _, errOut := f.run(t, "", append(args, "--table", "no_such_table")...)
			assert.Equal(t, exitError, code, "%v", args)
			assert.Contains(t, errOut, `database has no table "no_such_table": create it with "outbox migrate"`, "%v", args)
		}
	})
}

// TestMySQLDSNForms: parseTime is added when missing (the library refuses
// a connection without it), and mysql:// URLs work.
func TestMySQLDSNForms(t *testing.T) {
	t.Parallel()
	dsn := os.Getenv(mysqlDSNEnv)
	if dsn == "" {
		t.Skip(mysqlDSNEnv + " is not set")
	}
	f := newFixture(t, backend{name: "mysql", dsn: func(*testing.T) string { return dsn }})
	cfg, err := mysqldriver.ParseDSN(dsn)
	require.NoError(t, err)
	cfg.ParseTime = false
	noParseTime := cfg.FormatDSN()
	require.NotContains(t, noParseTime, "parseTime")
	u := url.URL{Scheme: "mysql", Host: cfg.Addr, Path: "/" + cfg.DBName}
	if cfg.Passwd != "" {
		u.User = url.UserPassword(cfg.User, cfg.Passwd)
	} else {
		u.User = url.User(cfg.User)
	}
	for _, d := range []string{noParseTime, u.String()} {
		code, out, errOut := runEnv(t, map[string]string{"OUTBOX_DSN": d, "OUTBOX_TABLE": f.table}, "", "list", "--json", "--status", "failed", "--oldest")
		require.Equal(t, exitOK, code, errOut)
		assert.Equal(t, []string{"bad-1", "bad-2"}, idsOf(jsonLines(t, out)))
	}
}

func TestDialector(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for dsn, want := range map[string]string{
		"postgres://u:p@h:5432/db?sslmode=disable":                  "postgres",
		"postgresql://h/db":                                         "postgres",
		"host=localhost user=u dbname=db sslmode=disable":           "postgres",
		"u:p@tcp(127.0.0.1:3306)/db?charset=utf8mb4":                "mysql",
		"u@unix(/run/mysqld/mysqld.sock)/db":                        "mysql",
		"mysql://u:p%40ss@127.0.0.1/db?charset=utf8mb4":             "mysql",
		"file:" + filepath.Join(dir, "a.db") + "?_txlock=immediate": "sqlite",
		"sqlite://" + filepath.Join(dir, "b.sqlite"):                "sqlite",
		filepath.Join(dir, "c.sqlite3"):                             "sqlite",
	} {
		d, name, err := dialector(dsn, true)
		require.NoError(t, err, dsn)
		assert.Equal(t, want, name, dsn)
		assert.Equal(t, want, d.Name(), dsn)
	}
	native, err := mysqlURL("mysql://u:p%40ss@db.example:3307/app?charset=utf8mb4")
	require.NoError(t, err)
	assert.Equal(t, "u:p@ss@tcp(db.example:3307)/app?charset=utf8mb4", native)
	native, err = mysqlURL("mysql://u@db.example/app")
	require.NoError(t, err)
	assert.Equal(t, "u@tcp(db.example:3306)/app", native)
	d, _, err := mysqlDialector("u@tcp(h:3306)/db?charset=utf8mb4")
	require.NoError(t, err)
	cfg, err := mysqldriver.ParseDSN(dsnOf(t, d))
	require.NoError(t, err)
	assert.True(t, cfg.ParseTime, "parseTime is added")
}

func TestVersion(t *testing.T) {
	t.Parallel()
	code, out, _ := runEnv(t, nil, "", "version")
	require.Equal(t, exitOK, code)
	assert.Regexp(t, `^outbox \S+ \(core \S+, go1\.\S+\)\n$`, out)
}

func dsnOf(t *testing.T, d gorm.Dialector) string {
	t.Helper()
	md, ok := d.(*mysql.Dialector)
	require.True(t, ok)
	return md.DSN
}

// TestMigrateUpgradesVersion1: a table of the first release's schema is
// refused by the other commands with the way out, shown by --print-sql
// (the upgrade, then the schema) and upgraded by migrate. MySQL never had
// a version 1 table.
func TestMigrateUpgradesVersion1(t *testing.T) {
	forEach(t, func(t *testing.T, f *fixture) {
		if f.name == "mysql" {
			t.Skip("no release created a version 1 table on MySQL")
		}
		v1, err := os.ReadFile(filepath.Join("..", "..", "internal", "store", "storetest", "schema-v1", f.name+".sql"))
		require.NoError(t, err)
		table := f.table + "_v1"
		t.Cleanup(func() { _ = f.db.Migrator().DropTable(table) })
		var ddl strings.Builder
		for _, line := range strings.Split(string(v1), "\n") {
			line, _, _ = strings.Cut(line, "--")
			ddl.WriteString(line + "\n")
		}
		for _, st := range strings.Split(strings.ReplaceAll(ddl.String(), "outbox_events", table), ";") {
			if st = strings.TrimSpace(st); st != "" {
				require.NoError(t, f.db.Exec(st).Error, st)
			}
		}
		env := map[string]string{"OUTBOX_DSN": f.dsn, "OUTBOX_TABLE": table}

		code, _, errOut := runEnv(t, env, "", "stats")
		assert.Equal(t, exitError, code)
		assert.Contains(t, errOut, "schema version 1")
		assert.Contains(t, errOut, `or run "outbox migrate"`)

		code, out, errOut := runEnv(t, env, "", "migrate", "--print-sql")
		require.Equal(t, exitOK, code, errOut)
		up, err := outbox.UpgradeSQL(f.name, table)
		require.NoError(t, err)
		schema, err := outbox.SchemaSQL(f.name, table)
		require.NoError(t, err)
		assert.Equal(t, "-- Table "+table+" is at schema version 1: upgrade it first.\n"+strings.TrimSpace(up)+"\n\n"+strings.TrimSpace(schema)+"\n", out)
		assert.False(t, f.db.Migrator().HasColumn(table, "seq"), "--print-sql changes nothing")

		code, out, errOut = runEnv(t, env, "", "migrate")
		require.Equal(t, exitOK, code, errOut)
		assert.Equal(t, "upgraded table "+table+" from schema version 1\n", out)
		assert.True(t, f.db.Migrator().HasColumn(table, "seq"))
		code, _, errOut = runEnv(t, env, "", "stats", "--max-failed", "0")
		assert.Equal(t, exitOK, code, errOut)
	})
}

// TestExitStatusesDocumented: the statuses a script may test are in the
// help, next to the command that returns them.
func TestExitStatusesDocumented(t *testing.T) {
	t.Parallel()
	code, out, _ := runEnv(t, nil, "", "help")
	require.Equal(t, exitOK, code)
	assert.Contains(t, out, "4 an event ID not in the table")
	code, _, errOut := runEnv(t, nil, "", "show", "-h")
	require.Equal(t, exitOK, code)
	assert.Contains(t, errOut, "\nExit status:\n  0  ok\n")
	assert.Contains(t, errOut, "\n  4  no event has this ID\n")
}
