package webhook_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
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

var secret = []byte("test-secret")

// received is one request a test server got.
type received struct {
	header http.Header
	body   []byte
}

// receiver is an httptest server that records requests and answers with
// the status its respond function picks.
type receiver struct {
	*httptest.Server
	mu   sync.Mutex
	reqs []received
}

func newReceiver(t *testing.T, respond func(w http.ResponseWriter, r *http.Request)) *receiver {
	t.Helper()
	rc := &receiver{}
	rc.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		rc.mu.Lock()
		rc.reqs = append(rc.reqs, received{header: r.Header.Clone(), body: body})
		rc.mu.Unlock()
		respond(w, r)
	}))
	t.Cleanup(rc.Close)
	return rc
}

func (rc *receiver) requests() []received {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]received(nil), rc.reqs...)
}

func status(code int) func(http.ResponseWriter, *http.Request) {
	return func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(code) }
}

func newHandler(t *testing.T, url string, cfg webhook.Config) outbox.Handler {
	t.Helper()
	s, err := webhook.New(url, secret, cfg)
	require.NoError(t, err)
	return s.Handler()
}

// pathHandler is newHandler's for one of handlerPaths.
func pathHandler(t *testing.T, p handlerPath, url string, cfg webhook.Config) outbox.Handler {
	t.Helper()
	return p.handler(newSender(t, url, cfg))
}

func sampleEvent() outbox.Event {
	return outbox.Event{
		ID:             "evt-1",
		Type:           "order.created",
		AggregateType:  "order",
		AggregateID:    "42",
		IdempotencyKey: "order-42-created",
		Payload:        json.RawMessage(`{"total":1250,"email":"ada@example.com"}`),
		OccurredAt:     time.Date(2025, 3, 4, 5, 6, 7, 123456000, time.UTC),
		Headers: map[string]string{
			"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
			"tenant":      "acme",
		},
	}
}

func TestSuccessEnvelopeAndSignature(t *testing.T) {
	t.Parallel()
	for _, p := range handlerPaths {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			var method, contentType string
			rc := newReceiver(t, func(w http.ResponseWriter, r *http.Request) {
				method, contentType = r.Method, r.Header.Get("Content-Type")
				w.WriteHeader(http.StatusNoContent)
			})
			h := pathHandler(t, p, rc.URL+"/hooks", webhook.Config{Header: http.Header{"Authorization": {"Bearer t0k"}}})

			before := time.Now().Unix()
			require.NoError(t, h(t.Context(), sampleEvent()))
			reqs := rc.requests()
			require.Len(t, reqs, 1)
			r := reqs[0]

			assert.Equal(t, http.MethodPost, method)
			assert.Equal(t, "application/json", contentType)
			assert.Equal(t, "evt-1", r.header.Get("Outbox-Event-Id"), "the name every adapter uses")
			assert.Equal(t, "order.created", r.header.Get("Outbox-Event-Type"))
			assert.Equal(t, "order", r.header.Get(wire.AggregateType))
			assert.Equal(t, "42", r.header.Get(wire.AggregateID))
			assert.Equal(t, "order-42-created", r.header.Get(wire.IdempotencyKey))
			assert.Equal(t, "2025-03-04T05:06:07.123456Z", r.header.Get(wire.OccurredAt))
			assert.Empty(t, r.header.Values("X-Outbox-Event-Id"), "the names of a development snapshot are not sent")
			assert.Empty(t, r.header.Values("X-Outbox-Event-Type"))
			assert.Equal(t, "Bearer t0k", r.header.Get("Authorization"))
			assert.Equal(t, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", r.header.Get("traceparent"))
			assert.Empty(t, r.header.Get("tenant"), "only the forwarded headers become HTTP headers")
			// Signed as Standard Webhooks by default (signature_test.go covers
			// both schemes).
			ts, err := strconv.ParseInt(r.header.Get(webhook.HeaderWebhookTimestamp), 10, 64)
			require.NoError(t, err)
			assert.GreaterOrEqual(t, ts, before)
			assert.Equal(t, "evt-1", r.header.Get(webhook.HeaderWebhookID))
			assert.Empty(t, r.header.Values(webhook.HeaderTimestamp), "the 0.1 scheme's headers are not sent by default")
			assert.Empty(t, r.header.Values(webhook.HeaderSignature))

			require.NoError(t, webhook.Verify(secret, r.header, r.body, 0))
			assert.Equal(t, webhook.SignStandardWebhooks(secret, "evt-1", r.header.Get(webhook.HeaderWebhookTimestamp), r.body), r.header.Get(webhook.HeaderWebhookSignature))

			var env webhook.Envelope
			require.NoError(t, json.Unmarshal(r.body, &env))
			assert.Equal(t, webhook.Envelope{
				ID: "evt-1", Type: "order.created", AggregateType: "order", AggregateID: "42",
				IdempotencyKey: "order-42-created",
				OccurredAt:     time.Date(2025, 3, 4, 5, 6, 7, 123456000, time.UTC),
				Headers:        sampleEvent().Headers,
				Payload:        json.RawMessage(`{"total":1250,"email":"ada@example.com"}`),
			}, env)
		})
	}
}

func TestPayloadOnly(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, status(http.StatusOK))
	h := newHandler(t, rc.URL, webhook.Config{PayloadOnly: true, ForwardHeaders: []string{}})
	require.NoError(t, h(t.Context(), sampleEvent()))
	r := rc.requests()[0]
	assert.Equal(t, `{"total":1250,"email":"ada@example.com"}`, string(r.body))
	assert.Empty(t, r.header.Get("traceparent"), "ForwardHeaders: empty forwards nothing")
	// Without the envelope the metadata is in the Outbox-* headers only.
	assert.Equal(t, "42", r.header.Get(wire.AggregateID))
	assert.Equal(t, "order-42-created", r.header.Get(wire.IdempotencyKey))
	require.NoError(t, webhook.Verify(secret, r.header, r.body, time.Minute))
}

// TestOutboxHeadersDescribeTheEvent: neither an event header (forwarded or
// not) nor Config.Header sets an Outbox-* header, and an Outbox-* value
// net/http cannot send is left out (the envelope carries it) instead of
// failing the request.
func TestOutboxHeadersDescribeTheEvent(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, status(http.StatusOK))
	h := newHandler(t, rc.URL, webhook.Config{
		Header:         http.Header{"Outbox-Aggregate-Type": {"static"}, "outbox-tenant": {"acme"}},
		ForwardHeaders: []string{"traceparent", "outbox-aggregate-id", "Outbox-Idempotency-Key"},
	})
	e := sampleEvent()
	e.AggregateType = ""
	e.AggregateID = "line\nbreak"
	e.Headers["Outbox-Aggregate-Id"] = "spoofed"
	e.Headers["outbox-idempotency-key"] = "spoofed"
	e.Headers["Traceparent"] = "ignored: the exact name wins"
	require.NoError(t, h(t.Context(), e))
	r := rc.requests()[0]

	assert.Equal(t, "evt-1", r.header.Get(wire.EventID))
	assert.Empty(t, r.header.Values(wire.AggregateType), "Config.Header cannot set it, and the event has none")
	assert.Empty(t, r.header.Values(wire.AggregateID), "not a valid header value: left out")
	assert.Equal(t, []string{"order-42-created"}, r.header.Values(wire.IdempotencyKey))
	assert.Equal(t, "acme", r.header.Get("Outbox-Tenant"), "other names are the operator's")
	assert.Equal(t, []string{e.Headers["traceparent"]}, r.header.Values("Traceparent"))

	var env webhook.Envelope
	require.NoError(t, json.Unmarshal(r.body, &env))
	assert.Equal(t, "line\nbreak", env.AggregateID, "the envelope carries it")
	require.NoError(t, webhook.Verify(secret, r.header, r.body, time.Minute))
}

// TestEnvelopeKeepsPayloadAsPublished: the envelope carries the payload's
// bytes as they are, without HTML escaping or compaction, and escapes no
// other field either.
func TestEnvelopeKeepsPayloadAsPublished(t *testing.T) {
	t.Parallel()
	for _, p := range handlerPaths {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			rc := newReceiver(t, status(http.StatusOK))
			h := pathHandler(t, p, rc.URL, webhook.Config{})
			payload := "{\"html\": \"<b>Tom & Jerry</b>\",\n \"price\": 1.50, \"sep\": \"\u2028\"}"
			e := sampleEvent()
			e.Payload = json.RawMessage(payload)
			e.Headers = map[string]string{"note": "<a href=\"x\">&</a>"}
			require.NoError(t, h(t.Context(), e))
			body := rc.requests()[0].body

			assert.True(t, json.Valid(body), "%s", body)
			assert.True(t, strings.HasSuffix(string(body), `,"payload":`+payload+`}`), "the payload is spliced in byte for byte: %s", body)
			assert.NotContains(t, string(body), `\u003c`)
			assert.NotContains(t, string(body), `\u0026`)
			assert.Contains(t, string(body), `"headers":{"note":"<a href=\"x\">&</a>"}`)
			var env webhook.Envelope
			require.NoError(t, json.Unmarshal(body, &env))
			assert.Equal(t, payload, string(env.Payload))
			assert.Equal(t, "evt-1", env.ID)
			require.NoError(t, webhook.Verify(secret, rc.requests()[0].header, body, time.Minute))

			// A payload that is not JSON fails for good, without being quoted.
			e.Payload = json.RawMessage(`{"email":"ada@example.com"`)
			err := h(t.Context(), e)
			require.Error(t, err)
			assert.True(t, outbox.IsPermanent(err))
			assert.ErrorIs(t, err, outbox.ErrInvalidEvent)
			assert.Equal(t, "outbox: invalid event: payload bytes are not valid JSON: POST "+rc.URL+" (outbox/webhook) (permanent)", err.Error(),
				"the cause first, then the request and the adapter")
			assert.NotContains(t, err.Error(), "ada@example.com")
			assert.Len(t, rc.requests(), 1, "nothing sent")
		})
	}
}

func TestStatusClassification(t *testing.T) {
	t.Parallel()
	for _, p := range handlerPaths {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			assert.Equal(t, "410 Gone", (&webhook.StatusError{StatusCode: http.StatusGone}).Error())
			assert.Equal(t, "status 599", (&webhook.StatusError{StatusCode: 599}).Error())
			const (
				retry = iota
				permanent
				unavailable
			)
			for code, class := range map[int]int{
				http.StatusBadRequest:            permanent,
				http.StatusUnauthorized:          permanent,
				http.StatusNotFound:              permanent,
				http.StatusRequestEntityTooLarge: permanent,
				http.StatusUnprocessableEntity:   permanent,
				http.StatusFound:                 permanent,
				http.StatusRequestTimeout:        retry,
				http.StatusTooManyRequests:       retry,
				http.StatusInternalServerError:   retry,
				http.StatusNotImplemented:        retry,
				http.StatusBadGateway:            unavailable,
				http.StatusServiceUnavailable:    unavailable,
				http.StatusGatewayTimeout:        unavailable,
				599:                              retry, // no standard text
			} {
				t.Run(strconv.Itoa(code), func(t *testing.T) {
					t.Parallel()
					rc := newReceiver(t, func(w http.ResponseWriter, _ *http.Request) {
						w.Header().Set("Location", "/elsewhere")
						w.WriteHeader(code)
						_, _ = fmt.Fprint(w, `echo: {"email":"ada@example.com"}`)
					})
					err := pathHandler(t, p, rc.URL, webhook.Config{})(t.Context(), sampleEvent())
					require.Error(t, err)
					assert.Equal(t, class == permanent, outbox.IsPermanent(err), "%v", err)
					assert.Equal(t, class == unavailable, outbox.IsUnavailable(err), "%v", err)
					var se *webhook.StatusError
					require.ErrorAs(t, err, &se)
					assert.Equal(t, code, se.StatusCode)
					// The status first ("410 Gone"), then the request and the
					// adapter, then the core's mark; never the event ID.
					want := se.Error() + " from POST " + rc.URL + " (outbox/webhook)"
					switch class {
					case permanent:
						want += " (permanent)"
					case unavailable:
						want += " (destination unavailable)"
					}
					assert.Equal(t, want, err.Error())
					assert.NotContains(t, err.Error(), "evt-1", "the event ID is the relay's to log")
					assert.NotContains(t, err.Error(), "ada@example.com", "neither payload nor response body in errors")
					assert.Len(t, rc.requests(), 1, "redirects are not followed")
				})
			}
		})
	}
}

func TestTimeoutIsRetryable(t *testing.T) {
	t.Parallel()
	for _, p := range handlerPaths {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			release := make(chan struct{})
			rc := newReceiver(t, func(w http.ResponseWriter, r *http.Request) {
				select {
				case <-r.Context().Done():
				case <-release:
				}
			})
			t.Cleanup(func() { close(release) }) // runs before rc.Close, which waits for handlers
			start := time.Now()
			err := pathHandler(t, p, rc.URL, webhook.Config{Timeout: 200 * time.Millisecond})(t.Context(), sampleEvent())
			require.Error(t, err)
			assert.False(t, outbox.IsPermanent(err))
			assert.False(t, outbox.IsUnavailable(err), "the receiver took the request: it may be slow on this event")
			assert.ErrorIs(t, err, context.DeadlineExceeded)
			assert.Less(t, time.Since(start), 5*time.Second)
		})
	}
}

func TestConnectionRefusedIsUnavailable(t *testing.T) {
	t.Parallel()
	for _, p := range handlerPaths {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			l, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			addr := l.Addr().String()
			require.NoError(t, l.Close()) // nothing listens there now

			err = pathHandler(t, p, "http://"+addr+"/hook?token=s3cret", webhook.Config{})(t.Context(), sampleEvent())
			require.Error(t, err)
			assert.False(t, outbox.IsPermanent(err))
			assert.True(t, outbox.IsUnavailable(err), "%v", err)
			assert.ErrorIs(t, err, syscall.ECONNREFUSED)
			assert.Regexp(t, `^dial tcp `+regexp.QuoteMeta(addr)+`: .*connection refused: POST http://`+regexp.QuoteMeta(addr)+` \(outbox/webhook\) \(destination unavailable\)$`, err.Error(),
				"the cause first, then the request (scheme and host) and the adapter")
			assert.NotContains(t, err.Error(), "evt-1", "the event ID is the relay's to log")
			assert.NotContains(t, err.Error(), "s3cret", "the URL's query may hold a token")
			assert.NotContains(t, err.Error(), "/hook", "nor its path")
		})
	}
}

func TestDNSFailureIsUnavailable(t *testing.T) {
	t.Parallel()
	for _, p := range handlerPaths {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			err := pathHandler(t, p, "http://outbox-test.invalid/hook", webhook.Config{Timeout: 5 * time.Second})(t.Context(), sampleEvent())
			require.Error(t, err)
			assert.True(t, outbox.IsUnavailable(err), "%v", err)
			assert.False(t, outbox.IsPermanent(err))
		})
	}
}

// TestConnectionDroppedIsUnavailable: the receiver takes the connection and
// drops it before answering, closing it or resetting it.
func TestConnectionDroppedIsUnavailable(t *testing.T) {
	t.Parallel()
	for _, p := range handlerPaths {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			for name, reset := range map[string]bool{"closed": false, "reset": true} {
				t.Run(name, func(t *testing.T) {
					t.Parallel()
					l, err := net.Listen("tcp", "127.0.0.1:0")
					require.NoError(t, err)
					t.Cleanup(func() { _ = l.Close() })
					go func() {
						for {
							c, err := l.Accept()
							if err != nil {
								return
							}
							_, _ = c.Read(make([]byte, 1024)) // the request has arrived
							if reset {
								_ = c.(*net.TCPConn).SetLinger(0) // close with RST
							}
							_ = c.Close()
						}
					}()
					err = pathHandler(t, p, "http://"+l.Addr().String()+"/hook", webhook.Config{})(t.Context(), sampleEvent())
					require.Error(t, err)
					assert.True(t, outbox.IsUnavailable(err), "%v", err)
					assert.False(t, outbox.IsPermanent(err))
				})
			}
		})
	}
}

func TestNewValidates(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		url    string
		secret []byte
		cfg    webhook.Config
	}{
		"no secret":        {"https://example.com/h", nil, webhook.Config{}},
		"relative URL":     {"/hooks", secret, webhook.Config{}},
		"other scheme":     {"ftp://example.com/h", secret, webhook.Config{}},
		"negative timeout": {"https://example.com/h", secret, webhook.Config{Timeout: -1}},
		"bad URL":          {"http://[::1:bad/?token=s3cret", secret, webhook.Config{}},
	} {
		_, err := webhook.New(tc.url, tc.secret, tc.cfg)
		require.Error(t, err, name)
		assert.NotContains(t, err.Error(), "s3cret", name)
	}
}

func TestVerify(t *testing.T) {
	t.Parallel()
	body := []byte(`{"id":"evt-1","payload":{"total":1}}`)
	signed := func(ts int64, b []byte) http.Header {
		s := strconv.FormatInt(ts, 10)
		return http.Header{
			webhook.HeaderTimestamp: {s},
			webhook.HeaderSignature: {webhook.Sign(secret, s, b)},
		}
	}
	now := time.Now().Unix()

	require.NoError(t, webhook.Verify(secret, signed(now, body), body, time.Minute))

	tampered := []byte(`{"id":"evt-1","payload":{"total":1000}}`)
	assert.ErrorIs(t, webhook.Verify(secret, signed(now, body), tampered, time.Minute), webhook.ErrInvalidSignature)

	assert.ErrorIs(t, webhook.Verify([]byte("other-secret"), signed(now, body), body, time.Minute), webhook.ErrInvalidSignature)

	// The timestamp is under the signature: moving it breaks the signature.
	h := signed(now-3600, body)
	h.Set(webhook.HeaderTimestamp, strconv.FormatInt(now, 10))
	assert.ErrorIs(t, webhook.Verify(secret, h, body, time.Minute), webhook.ErrInvalidSignature)

	// Correctly signed but old (a replay), or too far ahead.
	assert.ErrorIs(t, webhook.Verify(secret, signed(now-600, body), body, time.Minute), webhook.ErrStaleTimestamp)
	assert.ErrorIs(t, webhook.Verify(secret, signed(now-600, body), body, 0), webhook.ErrStaleTimestamp, "default max age is 5 minutes")
	assert.ErrorIs(t, webhook.Verify(secret, signed(now+600, body), body, time.Minute), webhook.ErrStaleTimestamp)
	require.NoError(t, webhook.Verify(secret, signed(now-600, body), body, time.Hour))

	missingTS := signed(now, body)
	missingTS.Del(webhook.HeaderTimestamp)
	assert.ErrorIs(t, webhook.Verify(secret, missingTS, body, time.Minute), webhook.ErrStaleTimestamp)
	for _, sig := range []string{"", "deadbeef", "sha256=zz", "sha256=00"} {
		h := signed(now, body)
		h.Set(webhook.HeaderSignature, sig)
		assert.ErrorIs(t, webhook.Verify(secret, h, body, time.Minute), webhook.ErrInvalidSignature, sig)
	}
	assert.Error(t, webhook.Verify(nil, signed(now, body), body, time.Minute))
}

// openDB returns a SQLite database with the outbox plugin installed.
func openDB(t *testing.T) (*gorm.DB, *outbox.Outbox) {
	return outboxtest.SQLite(t, outbox.Config{})
}

// TestEndToEnd wires the real outbox, with either handler: an accepted
// event ends sent, a rejected one (400) fails at once without retries, a
// 500 stays pending with its attempt counted, and a 503 is handed back
// uncounted.
func TestEndToEnd(t *testing.T) {
	t.Parallel()
	for _, p := range handlerPaths {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			rc := newReceiver(t, func(w http.ResponseWriter, r *http.Request) {
				switch r.Header.Get(wire.EventType) {
				case "order.rejected":
					w.WriteHeader(http.StatusBadRequest)
				case "order.later":
					w.WriteHeader(http.StatusInternalServerError)
				default:
					w.WriteHeader(http.StatusOK)
				}
			})
			db, ob := openDB(t)
			p.register(ob, outbox.AnyEvent, newSender(t, rc.URL, webhook.Config{}))

			require.NoError(t, db.Transaction(func(tx *gorm.DB) error {
				return outbox.Publish(tx,
					outbox.Event{ID: "ok", Type: "order.created", Payload: map[string]int{"total": 99}},
					outbox.Event{ID: "rejected", Type: "order.rejected", Payload: map[string]int{"total": 1}},
					outbox.Event{ID: "later", Type: "order.later", Payload: map[string]int{"total": 2}},
				)
			}))
			n, err := outboxtest.Relay(t, ob, db, outbox.RelayConfig{}).ProcessOnce(t.Context())
			require.NoError(t, err)
			require.Equal(t, 3, n)

			byID := map[string]received{}
			for _, r := range rc.requests() {
				require.NoError(t, webhook.Verify(secret, r.header, r.body, time.Minute))
				byID[r.header.Get(wire.EventID)] = r
			}
			require.Len(t, byID, 3)
			var env webhook.Envelope
			require.NoError(t, json.Unmarshal(byID["ok"].body, &env))
			assert.JSONEq(t, `{"total":99}`, string(env.Payload))

			rec := func(id string) outbox.Row {
				var r outbox.Row
				require.NoError(t, db.Table(outbox.DefaultTable).Where("named_id = ?", id).Take(&r).Error)
				return r
			}
			assert.Equal(t, outbox.StatusSent, rec("ok").Status)
			assert.Equal(t, outbox.StatusFailed, rec("rejected").Status, "a 4xx is permanent: no retries")
			assert.Equal(t, 1, rec("rejected").Attempts)
			assert.Equal(t, outbox.StatusPending, rec("later").Status, "a 500 is retried")
			assert.Equal(t, 1, rec("later").Attempts)

			// A 503 without Retry-After: the endpoint is down, not the event.
			down := newReceiver(t, status(http.StatusServiceUnavailable))
			db2, ob2 := openDB(t)
			p.register(ob2, outbox.AnyEvent, newSender(t, down.URL, webhook.Config{}))
			require.NoError(t, db2.Transaction(func(tx *gorm.DB) error {
				return outbox.Publish(tx, outbox.Event{ID: "paused", Type: "order.created", Payload: map[string]int{"total": 3}})
			}))
			n, err = outboxtest.Relay(t, ob2, db2, outbox.RelayConfig{}).ProcessOnce(t.Context())
			require.Equal(t, 1, n)
			require.True(t, outbox.IsUnavailable(err), "%v", err)
			var paused outbox.Row
			require.NoError(t, db2.Table(outbox.DefaultTable).Where("named_id = ?", "paused").Take(&paused).Error)
			assert.Equal(t, outbox.StatusPending, paused.Status)
			assert.Equal(t, 0, paused.Attempts, "handed back, no attempt counted")
		})
	}
}

// ExampleVerify shows a receiver: read the whole body, verify, then
// deduplicate by event ID and decode.
func ExampleVerify() {
	secret := []byte("shared-secret")
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, 2<<20))
		if err != nil {
			http.Error(w, "read error", http.StatusBadRequest)
			return
		}
		if err := webhook.Verify(secret, r.Header, body, 5*time.Minute); err != nil {
			// 401 is permanent for the sender: a bad signature will not fix
			// itself by retrying.
			http.Error(w, "bad signature", http.StatusUnauthorized)
			return
		}
		var env webhook.Envelope
		if err := json.Unmarshal(body, &env); err != nil {
			http.Error(w, "bad body", http.StatusBadRequest)
			return
		}
		// ... skip env.ID if already processed, else process env.Payload ...
		fmt.Println("verified", env.Type, string(env.Payload))
		w.WriteHeader(http.StatusNoContent)
	})
	srv := httptest.NewServer(handler)
	defer srv.Close()

	s, _ := webhook.New(srv.URL, secret, webhook.Config{})
	err := s.Handler()(context.Background(), outbox.Event{ID: "1", Type: "order.created", Payload: json.RawMessage(`{"total":5}`)})
	fmt.Println("error:", err)
	// Output:
	// verified order.created {"total":5}
	// error: <nil>
}

// TestKeptAliveConnectionClosedIsResent: a receiver that restarts closes
// the connection the client keeps alive. A request written on it just then
// is resent on a new connection and delivered, instead of failing and
// taking the relay into an outage pause it does not need.
func TestKeptAliveConnectionClosedIsResent(t *testing.T) {
	t.Parallel()
	for _, p := range handlerPaths {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			l, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			t.Cleanup(func() { _ = l.Close() })
			type delivery struct {
				conn int
				id   string
				key  string
			}
			got := make(chan delivery, 10)
			// The Sender's transport keeps its connections; closing them ends the
			// goroutines of both ends.
			var (
				mu    sync.Mutex
				conns []net.Conn
			)
			t.Cleanup(func() {
				mu.Lock()
				defer mu.Unlock()
				for _, c := range conns {
					_ = c.Close()
				}
			})
			go func() {
				for n := 1; ; n++ {
					c, err := l.Accept()
					if err != nil {
						return
					}
					mu.Lock()
					conns = append(conns, c)
					mu.Unlock()
					go func(n int, c net.Conn) {
						defer c.Close()
						br := bufio.NewReader(c)
						for i := 1; ; i++ {
							req, err := http.ReadRequest(br)
							if err != nil {
								return
							}
							_, _ = io.Copy(io.Discard, req.Body)
							if n == 1 && i == 2 {
								return // the restart: the request is read, never answered
							}
							got <- delivery{n, req.Header.Get(wire.EventID), req.Header.Get("Idempotency-Key")}
							_, _ = io.WriteString(c, "HTTP/1.1 204 No Content\r\n\r\n")
						}
					}(n, c)
				}
			}()
			h := pathHandler(t, p, "http://"+l.Addr().String()+"/hook", webhook.Config{})
			first, second := sampleEvent(), sampleEvent()
			second.ID, second.IdempotencyKey = "evt-2", ""

			require.NoError(t, h(t.Context(), first))
			assert.Equal(t, delivery{1, "evt-1", "order-42-created"}, <-got)
			require.NoError(t, h(t.Context(), second), "resent on a new connection")
			assert.Equal(t, delivery{2, "evt-2", "evt-2"}, <-got, "the key defaults to the event ID")
		})
	}
}
