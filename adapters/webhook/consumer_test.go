package webhook_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/adapters/webhook"
	"github.com/gorm-outbox/outbox/outboxtest"
	"github.com/gorm-outbox/outbox/wire"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"
)

// effect is what the tests' Handle writes, in the inbox transaction.
type effect struct {
	EventID string `gorm:"primaryKey"`
	Type    string
	Payload string
}

// consumerSide is a Consumer on its own database behind an httptest server.
type consumerSide struct {
	db    *gorm.DB
	srv   *httptest.Server
	calls atomic.Int32 // Handle calls, whatever their outcome
	logs  *syncBuffer
}

// newConsumerSide starts a Consumer whose Handle counts its calls, then
// runs handle (nil: record the effect).
func newConsumerSide(t *testing.T, cfg webhook.ConsumerConfig, handle func(ctx context.Context, tx *gorm.DB, m webhook.Message) error) *consumerSide {
	t.Helper()
	cs := &consumerSide{logs: &syncBuffer{}}
	cs.db, _ = outboxtest.SQLite(t, outbox.Config{})
	require.NoError(t, cs.db.AutoMigrate(&effect{}))
	if handle == nil {
		handle = recordEffect
	}
	cfg.Consumer = "billing"
	cfg.Handle = func(ctx context.Context, tx *gorm.DB, m webhook.Message) error {
		cs.calls.Add(1)
		return handle(ctx, tx, m)
	}
	cfg.Logger = slog.New(slog.NewTextHandler(cs.logs, nil))
	c, err := webhook.NewConsumer(cs.db, secret, cfg)
	require.NoError(t, err)
	cs.srv = httptest.NewServer(c)
	t.Cleanup(cs.srv.Close)
	return cs
}

func recordEffect(_ context.Context, tx *gorm.DB, m webhook.Message) error {
	return tx.Create(&effect{EventID: m.Event.ID, Type: m.Event.Type, Payload: string(m.Event.Payload.(json.RawMessage))}).Error
}

func (cs *consumerSide) effects(t *testing.T) []effect {
	t.Helper()
	var es []effect
	require.NoError(t, cs.db.Order("event_id").Find(&es).Error)
	return es
}

// syncBuffer is a log destination that server goroutines and the test
// share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// processUntil runs the relay until done reports true or a deadline passes.
func processUntil(t *testing.T, r *outbox.Relay, done func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !done() {
		require.True(t, time.Now().Before(deadline), "relay did not get there in time")
		_, _ = r.ProcessOnce(t.Context())
	}
}

// TestConsumerEndToEnd: the adapter's Sender, run by the outbox relay,
// posts to a Consumer. The event arrives intact (the envelope decoded into
// Message.Event, the request as Message.Raw with its body readable again),
// its effect commits once, the 204 marks the event sent, and nothing of the
// payload is logged.
func TestConsumerEndToEnd(t *testing.T) {
	t.Parallel()
	var got webhook.Message
	var rawBody []byte
	cs := newConsumerSide(t, webhook.ConsumerConfig{}, func(ctx context.Context, tx *gorm.DB, m webhook.Message) error {
		got = m
		rawBody, _ = io.ReadAll(m.Raw.Body)
		return recordEffect(ctx, tx, m)
	})
	db, ob := openDB(t)
	ob.Handle(outbox.AnyEvent, newHandler(t, cs.srv.URL, webhook.Config{}))
	want := sampleEvent()
	outboxtest.Publish(t, db, want)

	require.Equal(t, 1, outboxtest.Drain(t, outboxtest.Relay(t, ob, db, outbox.RelayConfig{})))
	assert.Equal(t, outbox.StatusSent, outboxtest.Row(t, db, want.ID).Status)
	assert.Equal(t, []effect{{EventID: "evt-1", Type: "order.created", Payload: `{"total":1250,"email":"ada@example.com"}`}}, cs.effects(t))
	assert.EqualValues(t, 1, cs.calls.Load())

	assert.Equal(t, want.ID, got.Event.ID)
	assert.Equal(t, want.Type, got.Event.Type)
	assert.Equal(t, want.AggregateType, got.Event.AggregateType)
	assert.Equal(t, want.AggregateID, got.Event.AggregateID)
	assert.Equal(t, want.IdempotencyKey, got.Event.IdempotencyKey)
	assert.True(t, want.OccurredAt.Equal(got.Event.OccurredAt), "%v", got.Event.OccurredAt)
	assert.Equal(t, want.Headers, got.Event.Headers)
	assert.Equal(t, want.Payload, got.Event.Payload, "byte for byte")
	require.NotNil(t, got.Raw)
	assert.Equal(t, "evt-1", got.Raw.Header.Get(wire.EventID), "the envelope's id is the Outbox-Event-Id header")
	assert.Contains(t, string(rawBody), `"payload":{"total":1250`)
	assert.NotContains(t, cs.logs.String(), "ada@example.com")
}

// TestConsumerDuplicate: the Sender posting one event twice (a lost
// response, a relay restarted before it marked the event sent) gets 2xx
// both times; Handle ran once.
func TestConsumerDuplicate(t *testing.T) {
	t.Parallel()
	cs := newConsumerSide(t, webhook.ConsumerConfig{}, nil)
	send := newHandler(t, cs.srv.URL, webhook.Config{})
	require.NoError(t, send(t.Context(), sampleEvent()))
	require.NoError(t, send(t.Context(), sampleEvent()), "a duplicate is acknowledged")
	assert.EqualValues(t, 1, cs.calls.Load(), "Handle runs once")
	assert.Len(t, cs.effects(t), 1)
}

// TestConsumerOutcomesOverRelay: what each Handle outcome makes of the
// event in the producer's outbox, so that both ends agree. A plain error is
// a 500: retried, attempt counted, and the redelivery succeeds. Permanent
// is a 422: failed at once, never redelivered. Unavailable is a 503 without
// Retry-After: handed back without counting an attempt (delivery pauses).
func TestConsumerOutcomesOverRelay(t *testing.T) {
	t.Parallel()
	var laterFailed atomic.Bool
	cs := newConsumerSide(t, webhook.ConsumerConfig{}, func(ctx context.Context, tx *gorm.DB, m webhook.Message) error {
		switch m.Event.Type {
		case "later":
			if laterFailed.CompareAndSwap(false, true) {
				// Written, then rolled back with the inbox entry.
				if err := recordEffect(ctx, tx, m); err != nil {
					return err
				}
				return errors.New("ledger locked")
			}
		case "never":
			return outbox.Permanent(errors.New("no such customer"))
		case "down":
			return outbox.Unavailable(errors.New("ledger service down"))
		}
		return recordEffect(ctx, tx, m)
	})
	db, ob := openDB(t)
	ob.Handle(outbox.AnyEvent, newHandler(t, cs.srv.URL, webhook.Config{}))
	relay := outboxtest.Relay(t, ob, db, outbox.RelayConfig{Backoff: func(int) time.Duration { return time.Millisecond }})

	outboxtest.Publish(t, db, outbox.Event{ID: "l", Type: "later", Payload: map[string]int{"n": 1}})
	n, err := relay.ProcessOnce(t.Context())
	require.NoError(t, err)
	require.Equal(t, 1, n)
	r := outboxtest.Row(t, db, "l")
	assert.Equal(t, outbox.StatusPending, r.Status, "a Handle error is retried")
	assert.Equal(t, 1, r.Attempts)
	assert.Empty(t, cs.effects(t), "the failed attempt's writes rolled back")
	processUntil(t, relay, func() bool { return outboxtest.Row(t, db, "l").Status == outbox.StatusSent })
	assert.Equal(t, []effect{{EventID: "l", Type: "later", Payload: `{"n":1}`}}, cs.effects(t))
	assert.EqualValues(t, 2, cs.calls.Load())

	outboxtest.Publish(t, db, outbox.Event{ID: "p", Type: "never", Payload: map[string]int{"n": 2}})
	n, err = relay.ProcessOnce(t.Context())
	require.NoError(t, err)
	require.Equal(t, 1, n)
	r = outboxtest.Row(t, db, "p")
	assert.Equal(t, outbox.StatusFailed, r.Status, "Permanent: 422, failed at once")
	assert.Equal(t, 1, r.Attempts)
	n, err = relay.ProcessOnce(t.Context())
	require.NoError(t, err)
	assert.Zero(t, n, "not redelivered")
	assert.EqualValues(t, 3, cs.calls.Load())
	assert.Contains(t, cs.logs.String(), "message failed permanently")
	assert.Contains(t, cs.logs.String(), "message_id=p")

	outboxtest.Publish(t, db, outbox.Event{ID: "d", Type: "down", Payload: map[string]int{"n": 3}})
	n, err = relay.ProcessOnce(t.Context())
	require.Equal(t, 1, n)
	require.True(t, outbox.IsUnavailable(err), "%v", err)
	r = outboxtest.Row(t, db, "d")
	assert.Equal(t, outbox.StatusPending, r.Status)
	assert.Zero(t, r.Attempts, "Unavailable: handed back, no attempt counted")
	assert.Len(t, cs.effects(t), 1)
}

// signedRequest builds a request as a Sender makes it, signed with key at
// Unix time ts.
func signedRequest(t *testing.T, url string, key []byte, ts int64, body string) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url, strings.NewReader(body))
	require.NoError(t, err)
	stamp := fmt.Sprint(ts)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(webhook.HeaderTimestamp, stamp)
	req.Header.Set(webhook.HeaderSignature, webhook.Sign(key, stamp, []byte(body)))
	return req
}

func do(t *testing.T, req *http.Request) *http.Response {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	require.NoError(t, resp.Body.Close())
	return resp
}

// TestConsumerStatusCodes sends requests directly, one per answer: every
// refusal the Sender must not retry is a 4xx, every failure retrying can
// cure a 5xx, and only a committed (or already committed) message a 2xx.
func TestConsumerStatusCodes(t *testing.T) {
	t.Parallel()
	rotated := []byte("previous-secret")
	cs := newConsumerSide(t, webhook.ConsumerConfig{MaxBodyBytes: 512, Secrets: [][]byte{rotated}},
		func(ctx context.Context, tx *gorm.DB, m webhook.Message) error {
			switch m.Event.Type {
			case "fail":
				return errors.New("boom")
			case "permanent":
				return outbox.Permanent(errors.New("refused"))
			case "unavailable":
				return outbox.Unavailable(errors.New("down"))
			case "panic":
				panic("handler bug")
			}
			return recordEffect(ctx, tx, m)
		})
	url := cs.srv.URL + "/hooks"
	now := time.Now().Unix()
	env := func(id, typ string) string {
		return fmt.Sprintf(`{"id":%q,"type":%q,"occurred_at":"2025-03-04T05:06:07Z","payload":{"n":1}}`, id, typ)
	}

	get, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	require.NoError(t, err)
	resp := do(t, get)
	assert.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)
	assert.Equal(t, http.MethodPost, resp.Header.Get("Allow"))

	big := fmt.Sprintf(`{"id":"big","type":"ok","payload":"%s"}`, strings.Repeat("x", 600))
	assert.Equal(t, http.StatusRequestEntityTooLarge, do(t, signedRequest(t, url, secret, now, big)).StatusCode)

	unsigned := signedRequest(t, url, secret, now, env("u", "ok"))
	unsigned.Header.Del(webhook.HeaderSignature)
	assert.Equal(t, http.StatusUnauthorized, do(t, unsigned).StatusCode, "no signature")
	noTS := signedRequest(t, url, secret, now, env("u", "ok"))
	noTS.Header.Del(webhook.HeaderTimestamp)
	assert.Equal(t, http.StatusUnauthorized, do(t, noTS).StatusCode, "no timestamp")
	tampered := signedRequest(t, url, secret, now, env("u", "ok"))
	tampered.Body = io.NopCloser(strings.NewReader(env("v", "ok")))
	assert.Equal(t, http.StatusUnauthorized, do(t, tampered).StatusCode, "body changed after signing")
	assert.Equal(t, http.StatusUnauthorized, do(t, signedRequest(t, url, []byte("other"), now, env("u", "ok"))).StatusCode, "another secret")
	assert.Equal(t, http.StatusUnauthorized, do(t, signedRequest(t, url, secret, now-600, env("u", "ok"))).StatusCode, "stale: default max age 5 minutes")
	assert.Equal(t, http.StatusUnauthorized, do(t, signedRequest(t, url, rotated, now+600, env("u", "ok"))).StatusCode, "from the future, under the rotated secret")

	assert.Equal(t, http.StatusBadRequest, do(t, signedRequest(t, url, secret, now, `{"id":`)).StatusCode, "malformed JSON")
	assert.Equal(t, http.StatusBadRequest, do(t, signedRequest(t, url, secret, now, `{"id":7}`)).StatusCode, "wrong type")
	assert.Equal(t, http.StatusBadRequest, do(t, signedRequest(t, url, secret, now, `{"total":5}`)).StatusCode, "no ID: a PayloadOnly body")
	assert.Equal(t, http.StatusUnprocessableEntity, do(t, signedRequest(t, url, secret, now, `{"id":"a\u0000b","type":"ok","payload":{}}`)).StatusCode, "an ID the inbox refuses")
	assert.Zero(t, cs.calls.Load(), "Handle ran for none of those")

	assert.Equal(t, http.StatusInternalServerError, do(t, signedRequest(t, url, secret, now, env("f", "fail"))).StatusCode)
	assert.Equal(t, http.StatusUnprocessableEntity, do(t, signedRequest(t, url, secret, now, env("p", "permanent"))).StatusCode)
	resp = do(t, signedRequest(t, url, secret, now, env("d", "unavailable")))
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	assert.Empty(t, resp.Header.Get("Retry-After"), "without Retry-After the Sender pauses without counting an attempt")
	assert.Equal(t, http.StatusInternalServerError, do(t, signedRequest(t, url, secret, now, env("x", "panic"))).StatusCode, "a panic is a 500, not a dropped connection")
	assert.Contains(t, cs.logs.String(), "Handle panicked")
	assert.Empty(t, cs.effects(t))

	assert.Equal(t, http.StatusNoContent, do(t, signedRequest(t, url, secret, now, env("ok", "ok"))).StatusCode)
	assert.Equal(t, http.StatusNoContent, do(t, signedRequest(t, url, secret, now, env("ok", "ok"))).StatusCode, "a duplicate")
	assert.Equal(t, http.StatusNoContent, do(t, signedRequest(t, url, rotated, now-60, env("rot", "ok"))).StatusCode, "the rotated secret")
	assert.Equal(t, []effect{{EventID: "ok", Type: "ok", Payload: `{"n":1}`}, {EventID: "rot", Type: "ok", Payload: `{"n":1}`}}, cs.effects(t))
	assert.EqualValues(t, 6, cs.calls.Load(), "4 failures, then ok and rot once each")
}

// TestConsumerMessageID: a MessageID for another producer's messages keys
// the inbox, here by a header; an empty one is refused with a 400.
func TestConsumerMessageID(t *testing.T) {
	t.Parallel()
	cs := newConsumerSide(t, webhook.ConsumerConfig{
		MessageID: func(m webhook.Message) string { return m.Raw.Header.Get("Delivery-Id") },
	}, func(ctx context.Context, tx *gorm.DB, m webhook.Message) error { return nil })
	body := `{"id":"same","type":"t","payload":{}}`
	req := func(delivery string) *http.Request {
		r := signedRequest(t, cs.srv.URL, secret, time.Now().Unix(), body)
		if delivery != "" {
			r.Header.Set("Delivery-Id", delivery)
		}
		return r
	}
	assert.Equal(t, http.StatusNoContent, do(t, req("d1")).StatusCode)
	assert.Equal(t, http.StatusNoContent, do(t, req("d2")).StatusCode)
	assert.Equal(t, http.StatusNoContent, do(t, req("d1")).StatusCode)
	assert.EqualValues(t, 2, cs.calls.Load(), "keyed by Delivery-Id, not the envelope's id")
	assert.Equal(t, http.StatusBadRequest, do(t, req("")).StatusCode)
	assert.EqualValues(t, 2, cs.calls.Load())
}

// TestConsumerCrashBetweenCommitAndAck: the effect commits, then the
// consumer dies before answering (the hook drops the connection and a new
// Consumer on the same database replaces the old one). The Sender sees no
// response and the relay sends the event again; the new Consumer finds it
// in the inbox, does not run Handle again, and answers 2xx, so the event
// ends sent with its effect committed once. Not parallel: it sets the
// package's hook.
func TestConsumerCrashBetweenCommitAndAck(t *testing.T) {
	db, _ := outboxtest.SQLite(t, outbox.Config{})
	require.NoError(t, db.AutoMigrate(&effect{}))
	var calls atomic.Int32
	newConsumer := func() http.Handler {
		c, err := webhook.NewConsumer(db, secret, webhook.ConsumerConfig{
			Consumer: "billing",
			Logger:   slog.New(slog.DiscardHandler),
			Handle: func(ctx context.Context, tx *gorm.DB, m webhook.Message) error {
				calls.Add(1)
				return recordEffect(ctx, tx, m)
			},
		})
		require.NoError(t, err)
		return c
	}
	var current atomic.Pointer[http.Handler]
	first := newConsumer()
	current.Store(&first)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		(*current.Load()).ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)

	var acks atomic.Int32
	webhook.SetBeforeAck(t, func(w http.ResponseWriter, _ *http.Request) {
		if acks.Add(1) > 1 {
			return
		}
		// The crash: the commit is done, the response never leaves.
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			_ = conn.Close()
		}
		restarted := newConsumer()
		current.Store(&restarted)
		panic(http.ErrAbortHandler)
	})

	pdb, ob := openDB(t)
	ob.Handle(outbox.AnyEvent, newHandler(t, srv.URL, webhook.Config{}))
	outboxtest.Publish(t, pdb, sampleEvent())
	relay := outboxtest.Relay(t, ob, pdb, outbox.RelayConfig{Backoff: func(int) time.Duration { return time.Millisecond }})

	_, err := relay.ProcessOnce(t.Context())
	require.Error(t, err, "the Sender got no response")
	r := outboxtest.Row(t, pdb, "evt-1")
	require.Equal(t, outbox.StatusPending, r.Status)
	var es []effect
	require.NoError(t, db.Find(&es).Error)
	require.Len(t, es, 1, "yet the effect committed")

	processUntil(t, relay, func() bool { return outboxtest.Row(t, pdb, "evt-1").Status == outbox.StatusSent })
	assert.EqualValues(t, 2, acks.Load(), "delivered again, and answered")
	assert.EqualValues(t, 1, calls.Load(), "Handle did not run again")
	require.NoError(t, db.Find(&es).Error)
	assert.Len(t, es, 1)
}

// TestNewConsumerInvalidConfig: what NewConsumer refuses, each an
// outbox.ErrInvalidConfig.
func TestNewConsumerInvalidConfig(t *testing.T) {
	t.Parallel()
	db, _ := outboxtest.SQLite(t, outbox.Config{})
	handle := func(context.Context, *gorm.DB, webhook.Message) error { return nil }
	ok := webhook.ConsumerConfig{Consumer: "c", Handle: handle}
	_, err := webhook.NewConsumer(db, secret, ok)
	require.NoError(t, err)

	plain := &gorm.DB{Config: &gorm.Config{}}
	for name, tc := range map[string]struct {
		db     *gorm.DB
		secret []byte
		cfg    webhook.ConsumerConfig
	}{
		"nil db":             {nil, secret, ok},
		"no plugin":          {plain, secret, ok},
		"no consumer":        {db, secret, webhook.ConsumerConfig{Handle: handle}},
		"no handle":          {db, secret, webhook.ConsumerConfig{Consumer: "c"}},
		"no secret":          {db, nil, ok},
		"empty extra secret": {db, secret, webhook.ConsumerConfig{Consumer: "c", Handle: handle, Secrets: [][]byte{{}}}},
		"negative max age":   {db, secret, webhook.ConsumerConfig{Consumer: "c", Handle: handle, MaxAge: -time.Second}},
		"negative max body":  {db, secret, webhook.ConsumerConfig{Consumer: "c", Handle: handle, MaxBodyBytes: -1}},
	} {
		_, err := webhook.NewConsumer(tc.db, tc.secret, tc.cfg)
		assert.ErrorIs(t, err, outbox.ErrInvalidConfig, name)
	}
}
