package outbox

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"
)

// recordingHandler is a slog.Handler that keeps every record, for tests
// that assert on what the outbox logged.
type recordingHandler struct {
	mu      sync.Mutex
	records []slog.Record
}

func (h *recordingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *recordingHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *recordingHandler) WithGroup(string) slog.Handler            { return h }

func (h *recordingHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	h.records = append(h.records, r.Clone())
	h.mu.Unlock()
	return nil
}

// find returns the records whose message starts with prefix.
func (h *recordingHandler) find(prefix string) []slog.Record {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []slog.Record
	for _, r := range h.records {
		if strings.HasPrefix(r.Message, prefix) {
			out = append(out, r)
		}
	}
	return out
}

// attrs returns a record's attributes by key.
func attrs(r slog.Record) map[string]slog.Value {
	m := map[string]slog.Value{}
	r.Attrs(func(a slog.Attr) bool {
		m[a.Key] = a.Value
		return true
	})
	return m
}

const commitFailedWarning = "outbox: COMMIT failed; its after-commit work is dropped"

// TestCommitFailureWarning makes a real COMMIT fail, with after-commit work
// pending, through a deferred foreign key that is checked only at COMMIT:
// the transaction's after-commit work (AfterCommit hooks, memory-mode
// events, the persistent events' wake-up) must not run, nothing it wrote
// may be in the database, and the plugin must log once what it dropped.
// MySQL/MariaDB check every constraint at once, never at COMMIT, so they
// have no such failure to provoke.
func TestCommitFailureWarning(t *testing.T) {
	t.Parallel()
	for _, bf := range []struct {
		name string
		b    func(*testing.T) backend
	}{
		{"SQLite", func(*testing.T) backend { return sqliteBackend }},
		{"SQLitePureGo", func(*testing.T) backend { return pureSQLiteBackend }},
		{"Postgres", postgresBackend},
		{"MySQL", func(t *testing.T) backend {
			t.Skip("MySQL and MariaDB have no deferred constraints: every constraint is checked by its statement, so COMMIT cannot fail on one")
			return backend{}
		}},
	} {
		for _, mode := range []Mode{Persistent, Memory} {
			t.Run(bf.name+"/"+mode.String(), func(t *testing.T) {
				t.Parallel()
				testCommitFailureWarning(t, bf.b(t), mode)
			})
		}
	}
}

func testCommitFailureWarning(t *testing.T, b backend, mode Mode) {
	logs := &recordingHandler{}
	e := b.setup(t, withConfig(Config{Mode: mode, Logger: slog.New(logs)}))
	if b.name == "sqlite" {
		// Foreign keys are a per-connection setting on SQLite, which can
		// only be changed outside a transaction: one connection, set once.
		sqlDB, err := e.db.DB()
		require.NoError(t, err)
		sqlDB.SetMaxOpenConns(1)
		require.NoError(t, e.db.Exec("PRAGMA foreign_keys = ON").Error)
		var on int
		require.NoError(t, e.db.Raw("PRAGMA foreign_keys").Scan(&on).Error)
		require.Equal(t, 1, on)
	}
	require.NoError(t, e.db.Exec("CREATE TABLE parents (id integer PRIMARY KEY)").Error)
	require.NoError(t, e.db.Exec("CREATE TABLE children (id integer PRIMARY KEY,"+
		" parent_id integer NOT NULL REFERENCES parents (id) DEFERRABLE INITIALLY DEFERRED)").Error)

	var mu sync.Mutex
	var ran []string
	note := func(s string) {
		mu.Lock()
		ran = append(ran, s)
		mu.Unlock()
	}
	e.ob.Handle("*", func(_ context.Context, ev Event) error { note("event " + ev.ID); return nil })
	// A relay of this process, as Run registers it: persistent commits
	// wake it.
	ws := &e.ob.siteFor(e.db).wakers
	w := ws.add()
	defer ws.remove(w)

	// A transaction that commits, as a control: its work runs, no warning.
	require.NoError(t, e.db.Transaction(func(tx *gorm.DB) error {
		if err := tx.Exec("INSERT INTO parents (id) VALUES (1)").Error; err != nil {
			return err
		}
		AfterCommit(tx, func() { note("hook ok") })
		return Publish(tx, Event{ID: "ok", Type: "x"})
	}))
	want := []string{"event ok", "hook ok"}
	if mode == Persistent {
		want = []string{"hook ok"} // the relay delivers it, later
		select {
		case <-w.wake:
		default:
			t.Error("the committed event did not wake the relays")
		}
	}
	assert.ElementsMatch(t, want, ran)
	assert.Empty(t, logs.find(commitFailedWarning), "a successful COMMIT logs nothing")
	mu.Lock()
	ran = nil
	mu.Unlock()

	// The orphan child passes its INSERT and fails the COMMIT.
	err := e.db.Transaction(func(tx *gorm.DB) error {
		if err := tx.Exec("INSERT INTO children (id, parent_id) VALUES (1, 42)").Error; err != nil {
			return err
		}
		AfterCommit(tx, func() { note("hook lost") })
		return Publish(tx, Event{ID: "lost", Type: "x"})
	})
	require.Error(t, err, "the deferred foreign key fails the COMMIT")
	assert.True(t, strings.Contains(strings.ToLower(err.Error()), "foreign key"), "COMMIT failed for another reason: %v", err)

	assert.Empty(t, ran, "no AfterCommit hook and no memory-mode event after a failed COMMIT")
	select {
	case <-w.wake:
		t.Error("the events of a failed COMMIT woke the relays")
	default:
	}

	warns := logs.find(commitFailedWarning)
	require.Len(t, warns, 1, "one warning for the failed COMMIT")
	r := warns[0]
	assert.Equal(t, slog.LevelWarn, r.Level)
	a := attrs(r)
	require.Contains(t, a, "error")
	assert.Contains(t, strings.ToLower(a["error"].String()), "foreign key", "the warning carries COMMIT's error")
	// Persistent: the AfterCommit hook and the wake-up of the relays;
	// Memory: the AfterCommit hook and the event's dispatch.
	assert.EqualValues(t, 2, a["hooks"].Int64(), "hooks")
	wantEvents := int64(0)
	if mode == Persistent {
		wantEvents = 1
	}
	assert.Equal(t, wantEvents, a["persistent_events"].Int64(), "persistent_events")

	// What another connection sees: nothing of the failed transaction. (The
	// pure-Go SQLite driver leaves a transaction whose COMMIT failed open on
	// its connection, so the check does not read through that pool.)
	other := e.reopen(t)
	var children int64
	require.NoError(t, other.Table("children").Count(&children).Error)
	assert.Zero(t, children)
	if mode == Persistent {
		var ids []string
		require.NoError(t, other.Table(e.ob.Table()).Order("seq").Pluck("named_id", &ids).Error)
		assert.Equal(t, []string{"ok"}, ids, "the failed transaction's event is not in the table")
	}
}
