package reliability

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/outboxtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// TestNoPayloadInLogsOrErrors drives events whose payload and header values
// carry a marker string through every path that logs or returns an error:
// handlers that fail, panic or are missing (persistent and memory mode),
// inserts that the database refuses, and events that fail validation. The
// marker must appear in no log line (the plugin's slog output and GORM's
// own logger at Info level, which prints every statement it runs with its
// arguments), in no returned error, and in no last_error column.
func TestNoPayloadInLogsOrErrors(t *testing.T) {
	t.Parallel()
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			testNoPayloadInLogsOrErrors(t, b)
		})
	}
}

func testNoPayloadInLogsOrErrors(t *testing.T, b backend) {
	marker := "SECRET-MARKER-" + randomHex(4)
	sink := newLogSink()
	gormLog := logger.New(log.New(sink, "gorm: ", 0), logger.Config{LogLevel: logger.Info})
	payload := map[string]string{"card": marker + "-4111111111111111", "email": marker + "@example.com"}
	headers := map[string]string{"authorization": "Bearer " + marker}
	var errs []error

	// Persistent mode: handlers that fail, panic, or do not exist.
	db := b.open(t)
	db.Logger = gormLog
	ob := install(t, db, outbox.Config{Logger: sink.logger()})
	ob.Handle("fails", func(context.Context, outbox.Event) error { return errors.New("upstream rejected the event") })
	ob.Handle("panics", func(_ context.Context, e outbox.Event) error {
		var v map[string]string
		_ = e.DecodePayload(&v)
		panic("cannot process card")
	})
	ob.Handle("permanent", func(context.Context, outbox.Event) error {
		return outbox.Permanent(errors.New("422 unprocessable"))
	})
	var events []outbox.Event
	for _, typ := range []string{"fails", "panics", "permanent", "unhandled"} {
		events = append(events, outbox.Event{Type: typ, Payload: payload, Headers: headers})
	}
	require.NoError(t, db.Transaction(func(tx *gorm.DB) error { return outbox.Publish(tx, events...) }))
	r := outboxtest.Relay(t, ob, db, outbox.RelayConfig{MaxAttempts: 2, Backoff: noBackoff})
	drain(t, db, ob.Table(), r, 30*time.Second)
	assert.EqualValues(t, 4, statusCounts(t, db, ob.Table())[outbox.StatusFailed])
	var lastErrors []string
	require.NoError(t, db.Table(ob.Table()).Where("last_error IS NOT NULL").Pluck("last_error", &lastErrors).Error)
	require.Len(t, lastErrors, 4)
	for _, le := range lastErrors {
		assert.NotContains(t, le, marker, "last_error must not contain the payload")
	}

	// Memory mode: a failing and a panicking handler, logged after commit.
	mdb := b.open(t)
	mdb.Logger = gormLog
	mob := install(t, mdb, outbox.Config{Mode: outbox.Memory, Logger: sink.logger()})
	mob.Handle("fails", func(context.Context, outbox.Event) error { return errors.New("upstream rejected the event") })
	mob.Handle("panics", func(context.Context, outbox.Event) error { panic("cannot process card") })
	require.NoError(t, mdb.Transaction(func(tx *gorm.DB) error {
		return outbox.Publish(tx, outbox.Event{Type: "fails", Payload: payload, Headers: headers},
			outbox.Event{Type: "panics", Payload: payload, Headers: headers},
			outbox.Event{Type: "unhandled", Payload: payload, Headers: headers})
	}))

	// Inserts the database refuses: the outbox table is gone.
	ddb := b.open(t)
	ddb.Logger = gormLog
	install(t, ddb, outbox.Config{Table: "sec_dropped", Logger: sink.logger()})
	require.NoError(t, ddb.Exec(`DROP TABLE sec_dropped`).Error)
	errs = append(errs, ddb.Transaction(func(tx *gorm.DB) error {
		return outbox.Publish(tx, outbox.Event{Type: "x", Payload: payload, Headers: headers})
	}))
	errs = append(errs, outbox.PublishAlone(ddb, outbox.Event{Type: "x", Payload: payload},
		outbox.Event{Type: "y", Payload: payload}))
	if b.name == "postgres" {
		// jsonb refuses a lone surrogate escape, and PostgreSQL's error
		// detail quotes the offending JSON; the error must not.
		errs = append(errs, db.Transaction(func(tx *gorm.DB) error {
			return outbox.Publish(tx, outbox.Event{Type: "x", Payload: json.RawMessage(`{"card":"` + marker + `\ud800"}`)})
		}))
	}

	// Events that fail validation, with the marker in the offending part.
	big := strings.Repeat(marker, (1<<20)/len(marker)+1)
	for _, e := range []outbox.Event{
		{Type: "x", Payload: json.RawMessage(`{"card":"` + marker + `"`)},
		{Type: "x", Payload: []byte(`{"card":"` + marker + "\xff" + `"}`)},
		{Type: "x", Payload: json.RawMessage(`{"card":"` + marker + `\u0000"}`)},
		{Type: "x", Payload: big},
		{Type: "x", Payload: make(chan string)},
		{Type: "x", Headers: map[string]string{"authorization": marker + "\xff"}},
		{Type: "x", Headers: map[string]string{"authorization": marker + "\x00"}},
		{Type: "x", Headers: map[string]string{"authorization": big[:70000]}},
	} {
		err := outbox.PublishAlone(db, e)
		require.ErrorIs(t, err, outbox.ErrInvalidEvent)
		errs = append(errs, err)
	}

	for _, err := range errs {
		require.Error(t, err)
		assert.NotContains(t, err.Error(), marker, "error returned to the caller carries the payload")
		assert.NotContains(t, fmt.Sprintf("%+v", err), marker)
	}
	out := sink.String()
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, marker) {
			t.Errorf("a log line carries the payload: %.300s", line)
		}
	}
	// The scenarios did log: the test would prove nothing otherwise.
	assert.Positive(t, sink.count("delivery failed"), "persistent-mode retries were logged")
	assert.Positive(t, sink.count("failed for good"), "persistent-mode failures were logged")
	assert.Positive(t, sink.count("handler failed"), "memory-mode failures were logged")
	assert.Contains(t, out, "gorm: ", "GORM's logger was on")
}

// TestUserStringsAreData publishes events whose every string (ID, type,
// aggregate, idempotency key, header names and values, payload keys and
// values) is a SQL fragment, and checks that they come back to the handler
// byte for byte, that no other table or row was touched, and that Replay
// treats SQL-looking IDs as IDs.
func TestUserStringsAreData(t *testing.T) {
	t.Parallel()
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			testUserStringsAreData(t, b.open(t))
		})
	}
}

var sqlFragments = []string{
	`'; DROP TABLE sec_canary; --`,
	`" OR "1"="1`,
	`x'); DELETE FROM outbox_events; --`,
	`x"); DELETE FROM "outbox_events"; --`,
	`' OR 1=1 --`,
	`$1`, `?1`, `?`, `:name`, `@p1`, `%s %d %v`,
	`\`, `\'`, `''`, `/* unterminated comment`, `--`, `;`,
	`' || (SELECT count(*) FROM sec_canary) || '`,
	`1; UPDATE outbox_events SET status = 'sent'`,
	"‘smart’ “quotes” ´`",
	`E'\x41'`,
	`\u0027`,
}

func testUserStringsAreData(t *testing.T, db *gorm.DB) {
	ob := install(t, db, outbox.Config{Logger: newLogSink().logger()})
	require.NoError(t, db.Exec(`CREATE TABLE sec_canary (id integer PRIMARY KEY, v text)`).Error)
	require.NoError(t, db.Exec(`INSERT INTO sec_canary (id, v) VALUES (1, 'intact')`).Error)

	var mu sync.Mutex
	got := map[string]outbox.Event{}
	ob.Handle("*", func(_ context.Context, e outbox.Event) error {
		if e.Type == "fail-me" {
			return outbox.Permanent(errors.New("rejected"))
		}
		mu.Lock()
		got[e.ID] = e
		mu.Unlock()
		return nil
	})
	want := map[string]outbox.Event{}
	var events []outbox.Event
	for i, s := range sqlFragments {
		e := outbox.Event{
			ID: fmt.Sprintf("%s#%d", s, i), Type: s, AggregateType: s, AggregateID: s,
			IdempotencyKey: fmt.Sprintf("key %d %s", i, s),
			Headers:        map[string]string{s: s, "plain": s},
			Payload:        map[string]string{s: s},
		}
		events = append(events, e)
		want[e.ID] = e
	}
	require.NoError(t, db.Transaction(func(tx *gorm.DB) error {
		if err := tx.Exec(`INSERT INTO sec_canary (id, v) VALUES (2, 'business row')`).Error; err != nil {
			return err
		}
		return outbox.Publish(tx, events...)
	}))
	r := outboxtest.Relay(t, ob, db, outbox.RelayConfig{Backoff: noBackoff})
	drain(t, db, ob.Table(), r, 30*time.Second)

	require.Len(t, got, len(want))
	for id, w := range want {
		g, ok := got[id]
		require.True(t, ok, "event %q not delivered", id)
		assert.Equal(t, w.Type, g.Type)
		assert.Equal(t, w.AggregateType, g.AggregateType)
		assert.Equal(t, w.AggregateID, g.AggregateID)
		assert.Equal(t, w.IdempotencyKey, g.IdempotencyKey)
		assert.Equal(t, w.Headers, g.Headers)
		var p map[string]string
		require.NoError(t, g.DecodePayload(&p))
		assert.Equal(t, w.Payload, p)
	}
	var canary []string
	require.NoError(t, db.Raw(`SELECT v FROM sec_canary ORDER BY id`).Scan(&canary).Error)
	assert.Equal(t, []string{"intact", "business row"}, canary)
	c := statusCounts(t, db, ob.Table())
	assert.Equal(t, map[outbox.Status]int64{outbox.StatusSent: int64(len(want))}, c)

	// Replay with SQL-looking IDs replays nothing but what they name.
	require.NoError(t, outbox.PublishAlone(db, outbox.Event{ID: "victim", Type: "fail-me"}))
	drain(t, db, ob.Table(), r, 30*time.Second)
	require.EqualValues(t, 1, statusCounts(t, db, ob.Table())[outbox.StatusFailed])
	n, err := ob.Replay(db, outbox.Filter{IDs: []string{`' OR '1'='1`, `victim' --`, `x') OR ('1'='1`, `victim"`, `%`, `*`}})
	require.NoError(t, err)
	assert.Zero(t, n)
	assert.EqualValues(t, 1, statusCounts(t, db, ob.Table())[outbox.StatusFailed])
	n, err = ob.Replay(db, outbox.Filter{IDs: []string{"victim"}})
	require.NoError(t, err)
	assert.Equal(t, 1, n)
}

// TestTableNameCannotInject checks that table names carrying SQL are refused
// by db.Use with ErrInvalidConfig before anything runs. FuzzTableName in
// the root package covers the general case.
func TestTableNameCannotInject(t *testing.T) {
	t.Parallel()
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			db := b.open(t)
			require.NoError(t, db.Exec(`CREATE TABLE sec_canary (id integer PRIMARY KEY)`).Error)
			require.NoError(t, db.Exec(`INSERT INTO sec_canary (id) VALUES (1)`).Error)
			for _, name := range []string{
				`x"; DROP TABLE sec_canary; --`, `outbox; DROP TABLE sec_canary`, `x" (id int); --`,
				"`x`", `[x]`, `x y`, `x.y`, `public.x`, `x--`, `x/*`, "x\x00", "é", `"x"`, `x'`,
				strings.Repeat("a", 64),
			} {
				err := db.Use(outbox.Plugin(outbox.Config{Table: name}))
				require.ErrorIs(t, err, outbox.ErrInvalidConfig, "%q", name)
			}
			var n int64
			require.NoError(t, db.Raw(`SELECT count(*) FROM sec_canary`).Scan(&n).Error)
			assert.EqualValues(t, 1, n)
		})
	}
}
