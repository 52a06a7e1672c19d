package outbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"
)

// refusalTests check what callers are told when the outbox refuses work:
// an error must never come with a commit the caller would repeat.
var refusalTests = map[string]func(*testing.T, backend){
	"AfterCommitRefusedCommitsNothing": testAfterCommitRefusedCommitsNothing,
	"PayloadRefusalsSayWhy":            testPayloadRefusalsSayWhy,
	"RecorderRetriedClosureWarns":      testRecorderRetriedClosureWarns,
}

// testRecorderRetriedClosureWarns: a retry helper that re-runs a function
// which records an event and saves the entity publishes, on the attempt
// that commits, the rolled-back attempt's event (kept on the entity so
// that a retry of the save alone publishes it once) and its own. The
// plugin cannot tell that from an intended second event, so it says so;
// recording outside the retried function publishes one event, silently.
func testRecorderRetriedClosureWarns(t *testing.T, b backend) {
	logs := &syncBuffer{}
	e := b.setup(t, withConfig(Config{Logger: slog.New(slog.NewTextHandler(logs, nil))}))
	errRetry := errors.New("serialization failure")
	retry := func(fn func(tx *gorm.DB) error) {
		for attempt := 1; ; attempt++ {
			err := e.db.Transaction(func(tx *gorm.DB) error {
				if err := fn(tx); err != nil {
					return err
				}
				if attempt == 1 {
					return errRetry // the first attempt rolls back
				}
				return nil
			})
			if !errors.Is(err, errRetry) {
				require.NoError(t, err)
				return
			}
		}
	}
	const warning = "events kept from a transaction that rolled back together with events recorded since"

	unsafe := Order{Total: 1}
	retry(func(tx *gorm.DB) error {
		unsafe.Record(Event{Type: "order.paid"})
		return tx.Save(&unsafe).Error
	})
	assert.Equal(t, 1, strings.Count(logs.String(), warning), "logs:\n%s", logs.String())
	assert.Contains(t, logs.String(), "model=outbox.Order kept=1 recorded_since=1")

	safe := Order{Total: 2}
	safe.Record(Event{Type: "order.paid"})
	retry(func(tx *gorm.DB) error { return tx.Save(&safe).Error })
	assert.Equal(t, 1, strings.Count(logs.String(), warning), "recording outside the retried function is silent")
	if !b.logical {
		assert.EqualValues(t, 2, e.count("aggregate_id = ?", fmt.Sprint(unsafe.ID)), "the unsafe pattern publishes twice, as documented")
		assert.EqualValues(t, 1, e.count("aggregate_id = ?", fmt.Sprint(safe.ID)))
	}
}

func ptr[T any](v T) *T { return &v }

// ptrText is a value whose MarshalText, on a pointer receiver, hides its
// field behind the text it returns.
type ptrText struct{ hidden, text string }

func (p *ptrText) MarshalText() ([]byte, error) { return []byte(p.text), nil }

// rawMarshaler is a payload whose MarshalJSON returns its own bytes.
type rawMarshaler string

func (m rawMarshaler) MarshalJSON() ([]byte, error) { return []byte(m), nil }

// testPayloadRefusalsSayWhy: invalid UTF-8 is refused alike whether it
// comes as bytes or in a Go string (encoding/json would silently replace
// it with U+FFFD), and a document too deep to parse is called too deep,
// not invalid. What is valid stays accepted: U+FFFD itself, and a
// MarshalJSON that writes its escape.
func testPayloadRefusalsSayWhy(t *testing.T, b backend) {
	e := b.setup(t)
	for name, tc := range map[string]struct {
		payload any
		want    string
	}{
		"Bytes":        {json.RawMessage("\"\xff\""), "payload is not valid UTF-8"},
		"String":       {"\xff", "payload is not valid UTF-8"},
		"InStructs":    {[]struct{ A map[string]any }{{A: map[string]any{"k": []any{"\xff"}}}}, "payload is not valid UTF-8"},
		"TooDeep":      {json.RawMessage(strings.Repeat(`{"a":`, 10001) + "1" + strings.Repeat("}", 10001)), "deeper than 31 levels"},
		"PtrText":      {&struct{ T ptrText }{T: ptrText{text: "\xff"}}, "payload is not valid UTF-8"},
		"TooDeepBytes": {[]byte(strings.Repeat("[", 20000) + strings.Repeat("]", 20000)), "deeper than 31 levels"},
	} {
		t.Run(name, func(t *testing.T) {
			err := PublishAlone(e.db, Event{Type: "x", Payload: tc.payload})
			require.ErrorIs(t, err, ErrInvalidEvent)
			assert.ErrorContains(t, err, tc.want)
		})
	}
	for name, p := range map[string]any{
		"ReplacementChar":        "\ufffd",
		"PtrTextHidesField":      &struct{ T ptrText }{T: ptrText{hidden: "\xff", text: "\ufffd"}},
		"ReplacementCharEscaped": json.RawMessage(`"\ufffd"`),
		"MarshalerWritesEscape":  map[string]rawMarshaler{"k": `"\ufffd"`},
		"SkippedField": struct {
			A string
			B string `json:"-"`
		}{A: "\ufffd", B: "\xff"},
	} {
		t.Run(name, func(t *testing.T) {
			require.NoError(t, PublishAlone(e.db, Event{Type: "x", Payload: p}))
		})
	}
}

// testAfterCommitRefusedCommitsNothing: AfterCommit on a transaction whose
// commit the plugin cannot see (no plugin on the *gorm.DB, or a
// transaction begun inside db.Connection) cannot run its function. The
// transaction must then not commit: db.Transaction returning an error with
// the business row committed invites a retry that writes it twice.
func testAfterCommitRefusedCommitsNothing(t *testing.T, b backend) {
	bare := b.open(t, &gorm.Config{})
	require.NoError(t, bare.AutoMigrate(&Order{}))
	e := b.setup(t)
	for _, tc := range []struct {
		name string
		db   *gorm.DB
		want error
		run  func(db *gorm.DB, fn func()) error
	}{
		{"NoPlugin", bare, ErrNotInstalled, func(db *gorm.DB, fn func()) error {
			return db.Transaction(func(tx *gorm.DB) error {
				if err := tx.Create(&Order{Total: 1}).Error; err != nil {
					return err
				}
				AfterCommit(tx, fn)
				return nil
			})
		}},
		{"NoPluginWritesAfter", bare, ErrNotInstalled, func(db *gorm.DB, fn func()) error {
			return db.Transaction(func(tx *gorm.DB) error {
				AfterCommit(tx, fn)
				_ = tx.Create(&Order{Total: 2}).Error // the caller ignores this error too
				return nil
			})
		}},
		{"NoPluginNested", bare, nil, func(db *gorm.DB, fn func()) error {
			return db.Transaction(func(tx *gorm.DB) error {
				if err := tx.Create(&Order{Total: 3}).Error; err != nil {
					return err
				}
				return tx.Transaction(func(inner *gorm.DB) error {
					AfterCommit(inner, fn)
					return nil
				})
			})
		}},
		{"Untracked", e.db, ErrUntrackedTransaction, func(db *gorm.DB, fn func()) error {
			return db.Connection(func(conn *gorm.DB) error {
				return conn.Transaction(func(tx *gorm.DB) error {
					if err := tx.Create(&Order{Total: 4}).Error; err != nil {
						return err
					}
					AfterCommit(tx, fn)
					return nil
				})
			})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var before int64
			require.NoError(t, tc.db.Model(&Order{}).Count(&before).Error)
			ran := false
			err := tc.run(tc.db, func() { ran = true })
			require.Error(t, err, "the function can never run: Transaction must say so")
			if tc.want != nil {
				assert.ErrorIs(t, err, tc.want)
			}
			var after int64
			require.NoError(t, tc.db.Model(&Order{}).Count(&after).Error)
			assert.Equal(t, before, after, "Transaction returned %v and committed the business row", err)
			assert.False(t, ran)
		})
	}
}
