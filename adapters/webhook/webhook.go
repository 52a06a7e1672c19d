// Package webhook delivers outbox events as signed HTTP POST requests. It
// uses the standard library only.
//
// Delivery guarantee: at least once; a request whose response is lost (a
// timeout after the receiver acted, a relay crash before "mark sent") is sent
// again, so receivers deduplicate by the Outbox-Event-Id header (also the
// envelope's "id").
//
// # Request
//
// The body is an [Envelope] by default: the event's ID, type, aggregate,
// idempotency key, occurred_at, headers and JSON payload in one signed
// document, so that a receiver gets the metadata under the signature. Set
// [Config.PayloadOnly] to post the bare payload instead. The request carries:
//
//	Content-Type: application/json
//	Outbox-Event-Id: <event ID>
//	Outbox-Event-Type: <event type>
//	Outbox-Aggregate-Type: <aggregate type, when set>
//	Outbox-Aggregate-Id: <aggregate ID, when set>
//	Outbox-Idempotency-Key: <idempotency key>
//	Idempotency-Key: <idempotency key>
//	Outbox-Occurred-At: <OccurredAt, RFC 3339, UTC, microseconds>
//	X-Outbox-Timestamp: <Unix seconds when this attempt was sent>
//	X-Outbox-Signature: sha256=<hex HMAC-SHA256 of timestamp + "." + body>
//
// plus the event headers named in [Config.ForwardHeaders] (traceparent,
// tracestate and baggage by default) and any static [Config.Header].
//
// The Outbox-* headers are those of every outbox adapter, built by
// [wire.Headers]; neither an event header nor Config.Header can set them.
// They are not signed (the envelope's copies are). An Outbox-* value that is
// not a valid HTTP header value is left out, except the event ID and type.
//
// Every attempt is signed afresh, so a retry is never stale; receivers check
// the signature and the timestamp's age with [Verify], which defeats
// replays older than its max age, and deduplicate by event ID within it.
// A Go receiver with the outbox plugin on its database can mount a
// [Consumer] ([NewConsumer]) instead: it verifies, applies each event once
// through the inbox and answers with the status codes the Sender expects.
//
// # Outcome
//
// A 2xx response is success. Any other 4xx than 408 and 429, and a 3xx
// (redirects are not followed: a signed body is not re-posted to another
// address), is a permanent failure ([outbox.Permanent]): the relay fails the
// event at once. 5xx, 408, 429, timeouts and network errors are returned as
// plain errors, which the relay retries with backoff, or no sooner than a
// Retry-After header asks (capped at an hour). Errors name the event
// ID, the host and the status, never the payload or the response body.
//
// Outages: a request that cannot reach the receiver (DNS, connection
// refused, dial or TLS failure, a connection reset or closed before the
// response), and a 502, 503 or 504 without Retry-After, are reported as
// [outbox.Unavailable]: the relay hands the event back without counting an
// attempt and pauses delivery until the endpoint answers again. A request
// written on a kept-alive connection that the receiver had closed (it
// restarted, or its idle timeout ran out) is first resent on a new
// connection by net/http, which the Idempotency-Key header allows. A timeout
// waiting for the response of a receiver that accepted the request is a
// plain retry: a slow receiver may be slow on this event.
//
// Ordering: each relay worker sends one event at a time and waits for the
// response; a retried event arrives after those sent meanwhile, and
// several relays interleave, so receivers must not rely on arrival order.
package webhook

import (
	"bytes"
	"cmp"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/wire"
)

// Request headers set on every delivery, besides Content-Type and the
// Outbox-* headers named in package [github.com/gorm-outbox/outbox/wire].
const (
	// HeaderTimestamp carries the time of this attempt in decimal Unix
	// seconds; it is part of the signed string.
	HeaderTimestamp = "X-Outbox-Timestamp"
	// HeaderSignature carries "sha256=" and the hex HMAC-SHA256 of
	// timestamp + "." + body (see [Sign]).
	HeaderSignature = "X-Outbox-Signature"
)

// signaturePrefix names the algorithm, leaving room for another one later.
const signaturePrefix = "sha256="

// Defaults.
const (
	// DefaultTimeout is [Config.Timeout]'s default.
	DefaultTimeout = 10 * time.Second
	// DefaultMaxAge is the largest difference between a request's timestamp
	// and the receiver's clock that [Verify] accepts when given 0.
	DefaultMaxAge = 5 * time.Minute
)

// maxDrain bounds how much of a response body is read so the connection can
// be reused; a receiver streaming more does not hold the relay.
const maxDrain = 64 << 10

// Envelope is the request body unless [Config.PayloadOnly] is set.
// Receivers can decode into it.
type Envelope struct {
	// ID is the event ID; deliveries of one event share it.
	ID string `json:"id"`
	// Type is the event type, such as "order.created".
	Type string `json:"type"`
	// AggregateType and AggregateID name the entity the event is about;
	// omitted when empty.
	AggregateType string `json:"aggregate_type,omitempty"`
	AggregateID   string `json:"aggregate_id,omitempty"`
	// IdempotencyKey is the publisher's idempotency key (the ID unless set).
	IdempotencyKey string `json:"idempotency_key,omitempty"`
	// OccurredAt is when the event happened, in UTC.
	OccurredAt time.Time `json:"occurred_at"`
	// Headers are all the event's headers, trace context included;
	// omitted when there are none.
	Headers map[string]string `json:"headers,omitempty"`
	// Payload is the event's JSON payload, byte for byte as the handler
	// received it: not re-encoded, so "<", ">" and "&" stay as they are.
	Payload json.RawMessage `json:"payload"`
}

// Config configures a [Sender]. Its zero value is usable.
type Config struct {
	// Client sends the requests. The sender uses a copy that never follows
	// redirects. Defaults to a client on http.DefaultTransport.
	Client *http.Client

	// Timeout bounds one request, response headers and body drain included;
	// the relay's deadline applies too. Defaults to 10 seconds.
	Timeout time.Duration

	// PayloadOnly posts the event's JSON payload as the body instead of an
	// [Envelope]; the metadata is then only in the Outbox-* headers.
	// Defaults to false (the envelope).
	PayloadOnly bool

	// Header is added to every request, for example an Authorization
	// header the receiver requires. It cannot override the X-Outbox-*
	// headers or Content-Type, and its entries with the reserved Outbox-*
	// names of package wire are ignored. Defaults to none.
	Header http.Header

	// ForwardHeaders names the event headers that are also sent as HTTP
	// headers, so the receiver's tracing middleware picks them up. Names
	// are matched case-insensitively; a value that is not a valid HTTP
	// header value is not forwarded (it stays in the envelope). All event
	// headers are in the envelope regardless. Defaults to traceparent,
	// tracestate and baggage.
	ForwardHeaders []string
}

// Sender posts outbox events to one URL. Create it with [New]; it is safe for
// concurrent use.
type Sender struct {
	url     string
	host    string
	secret  []byte
	client  *http.Client
	cfg     Config
	forward []string
}

// New returns a sender that posts events to endpoint (an http or https URL),
// signed with secret. Share the secret with the receiver, which checks
// requests with [Verify].
func New(endpoint string, secret []byte, cfg Config) (*Sender, error) {
	u, err := url.Parse(endpoint)
	if err != nil {
		// url.Parse's error quotes the URL, which may hold a token.
		return nil, errors.New("outbox/webhook: endpoint is not a valid URL")
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("outbox/webhook: endpoint %s must be an absolute http or https URL", u.Redacted())
	}
	if len(secret) == 0 {
		return nil, errors.New("outbox/webhook: New needs a non-empty secret to sign requests")
	}
	if cfg.Timeout < 0 {
		return nil, fmt.Errorf("outbox/webhook: negative Timeout %v; use 0 for the default", cfg.Timeout)
	}
	cfg.Timeout = cmp.Or(cfg.Timeout, DefaultTimeout)
	cfg.Header = cfg.Header.Clone()

	client := &http.Client{}
	if cfg.Client != nil {
		c := *cfg.Client
		client = &c
	}
	client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

	forward := cfg.ForwardHeaders
	if forward == nil {
		forward = []string{"traceparent", "tracestate", "baggage"}
	}
	return &Sender{
		url:     endpoint,
		host:    u.Host,
		secret:  bytes.Clone(secret),
		client:  client,
		cfg:     cfg,
		forward: forward,
	}, nil
}

// StatusError is the error for a response outside 2xx. It is wrapped with
// [outbox.Permanent] when retrying cannot help, and with
// [outbox.Unavailable] for a 502, 503 or 504 without Retry-After (see the
// package doc).
type StatusError struct {
	// StatusCode is the response's HTTP status.
	StatusCode int
}

// Error returns the status, such as "status 503 Service Unavailable".
func (e *StatusError) Error() string {
	return fmt.Sprintf("status %d %s", e.StatusCode, http.StatusText(e.StatusCode))
}

// Handler returns the outbox handler that posts each event it is given:
// register it with ob.Handle(eventType, s.Handler()).
func (s *Sender) Handler() outbox.Handler {
	return s.send
}

func (s *Sender) send(ctx context.Context, e outbox.Event) error {
	body, err := s.body(e)
	if err != nil {
		return outbox.Permanent(fmt.Errorf("outbox/webhook: deliver event %s: %w", e.ID, err))
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	// Whether a connection to the receiver was made tells an endpoint that
	// cannot be reached from one that was slow to answer.
	var connected atomic.Bool
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		GotConn: func(httptrace.GotConnInfo) { connected.Store(true) },
	})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url, bytes.NewReader(body))
	if err != nil {
		return outbox.Permanent(fmt.Errorf("outbox/webhook: deliver event %s: build request for %s", e.ID, s.host))
	}
	for k, vs := range s.cfg.Header {
		if !wire.Reserved(k) {
			req.Header[k] = append([]string(nil), vs...)
		}
	}
	if req.Header.Get("User-Agent") == "" {
		req.Header.Set("User-Agent", "gorm-outbox-webhook/1")
	}
	wire.Headers(e, func(k, v string) {
		switch {
		case k == wire.EventID || k == wire.EventType:
			// The receiver cannot do without them: a value net/http
			// refuses fails the request rather than going missing.
			req.Header.Set(k, v)
		case !validHeaderValue(v):
			// Left out; the envelope carries it.
		case wire.Reserved(k) || s.forwarded(k):
			req.Header.Set(k, v)
		}
	})
	ts := strconv.FormatInt(time.Now().Unix(), 10)
	if key := cmp.Or(e.IdempotencyKey, e.ID); validHeaderValue(key) {
		// The de facto standard name, which receivers' middleware knows,
		// and which lets net/http resend the request on a fresh connection
		// when a kept-alive one turns out to have been closed by the
		// receiver (a restart, an idle timeout) instead of failing it.
		req.Header.Set("Idempotency-Key", key)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(HeaderTimestamp, ts)
	req.Header.Set(HeaderSignature, sign(s.secret, ts, body))

	resp, err := s.client.Do(req)
	if err != nil {
		// *url.Error quotes the whole URL, which may carry a token; name
		// the host only.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		err = fmt.Errorf("outbox/webhook: deliver event %s to %s: %w", e.ID, s.host, err)
		if unreachable(err, connected.Load()) {
			return outbox.Unavailable(err)
		}
		return err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxDrain))
	_ = resp.Body.Close()

	code := resp.StatusCode
	if code >= 200 && code < 300 {
		return nil
	}
	err = fmt.Errorf("outbox/webhook: deliver event %s to %s: %w", e.ID, s.host, &StatusError{StatusCode: code})
	if (code >= 300 && code < 500) && code != http.StatusRequestTimeout && code != http.StatusTooManyRequests {
		return outbox.Permanent(err)
	}
	if d, ok := retryAfter(resp.Header.Get("Retry-After"), time.Now()); ok {
		// Honoured as asked, at the cost of an attempt: an Unavailable
		// error would be probed again on the relay's schedule instead.
		return outbox.RetryAfter(err, d)
	}
	switch code {
	case http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		// A proxy or load balancer saying the service behind it is down,
		// or the service saying it is: not about this event.
		return outbox.Unavailable(err)
	}
	return err
}

// unreachable reports whether a request that failed without a response
// never reached the receiver (no connection: DNS, refused, dial or TLS
// failure, or a timeout while connecting) or lost its connection (reset,
// closed, broken pipe). A timeout on a connection that was made is not:
// the receiver may be slow on this very event.
func unreachable(err error, connected bool) bool {
	if errors.Is(err, context.Canceled) {
		return false // the caller gave up; nothing is known about the receiver
	}
	if !connected {
		return true
	}
	// ECONNREFUSED after a connection was made: net/http resent the
	// request on a new connection and the receiver was gone by then.
	for _, target := range []error{syscall.ECONNREFUSED, syscall.ECONNRESET, syscall.ECONNABORTED, syscall.EPIPE, io.EOF, io.ErrUnexpectedEOF, net.ErrClosed} {
		if errors.Is(err, target) {
			return true
		}
	}
	// net/http's unexported errServerClosedIdle: the receiver closed a
	// kept-alive connection as the request was written on it.
	return strings.Contains(err.Error(), "server closed idle connection")
}

// maxRetryAfter caps what a receiver can ask for, so a bogus header cannot
// park an event for days.
const maxRetryAfter = time.Hour

// retryAfter parses a Retry-After header: delay-seconds or an HTTP date.
func retryAfter(v string, now time.Time) (time.Duration, bool) {
	if v == "" {
		return 0, false
	}
	var d time.Duration
	if secs, err := strconv.Atoi(v); err == nil {
		d = time.Duration(secs) * time.Second
	} else if t, err := http.ParseTime(v); err == nil {
		d = t.Sub(now)
	} else {
		return 0, false
	}
	return min(max(d, 0), maxRetryAfter), true
}

func (s *Sender) body(e outbox.Event) ([]byte, error) {
	payload, err := e.PayloadJSON()
	if err != nil {
		return nil, err
	}
	if s.cfg.PayloadOnly {
		return payload, nil
	}
	return envelope(e, payload)
}

// envelope encodes e's Envelope with payload spliced in as it is: encoding
// it through json.Marshal would compact it and escape "<", ">" and "&" as
// \u003c, \u003e and \u0026. The other fields are not HTML-escaped either.
func envelope(e outbox.Event, payload []byte) ([]byte, error) {
	if !json.Valid(payload) {
		// Never quote the payload: it may hold personal data.
		return nil, errors.New("encode envelope: invalid JSON payload")
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	// Payload is the last field; encoded as null here, replaced below.
	err := enc.Encode(Envelope{
		ID:             e.ID,
		Type:           e.Type,
		AggregateType:  e.AggregateType,
		AggregateID:    e.AggregateID,
		IdempotencyKey: e.IdempotencyKey,
		OccurredAt:     e.OccurredAt.UTC(),
		Headers:        e.Headers,
	})
	if err != nil {
		return nil, errors.New("encode envelope: invalid headers or occurred_at")
	}
	head, ok := bytes.CutSuffix(b.Bytes(), []byte("null}\n"))
	if !ok {
		return nil, errors.New("encode envelope: unexpected encoding")
	}
	out := make([]byte, 0, len(head)+len(payload)+1)
	out = append(append(append(out, head...), payload...), '}')
	return out, nil
}

// forwarded reports whether the event header name is one of
// Config.ForwardHeaders, ignoring case.
func (s *Sender) forwarded(name string) bool {
	for _, f := range s.forward {
		if strings.EqualFold(f, name) {
			return true
		}
	}
	return false
}

// validHeaderValue accepts what net/http sends without error: no control
// characters other than tab.
func validHeaderValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if c := v[i]; (c < ' ' && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

// Sign returns the X-Outbox-Signature value for body sent with the
// X-Outbox-Timestamp value timestamp (decimal Unix seconds): "sha256=" and
// the hex HMAC-SHA256 of timestamp + "." + body under secret. Receivers in
// other languages compute the same to check a request.
func Sign(secret []byte, timestamp string, body []byte) string {
	return sign(secret, timestamp, body)
}

func sign(secret []byte, ts string, body []byte) string {
	return signaturePrefix + hex.EncodeToString(mac(secret, ts, body))
}

func mac(secret []byte, ts string, body []byte) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(ts))
	m.Write([]byte{'.'})
	m.Write(body)
	return m.Sum(nil)
}

// Errors of [Verify].
var (
	// ErrInvalidSignature: the signature is missing, malformed, or does not
	// match the body and timestamp under the secret.
	ErrInvalidSignature = errors.New("outbox/webhook: invalid signature")
	// ErrStaleTimestamp: the timestamp is missing, malformed, or further
	// from the receiver's clock than the max age (a replay, or clocks that
	// disagree).
	ErrStaleTimestamp = errors.New("outbox/webhook: timestamp missing or outside the allowed age")
)

// Verify checks a request a [Sender] made: header is the request's header and
// body its raw body, read in full before decoding. It returns nil when the
// X-Outbox-Signature header matches the body and the X-Outbox-Timestamp
// header under secret and that timestamp is within maxAge of the receiver's
// clock (either way, to allow for skew); otherwise an error wrapping
// [ErrInvalidSignature] or [ErrStaleTimestamp]. maxAge 0 means
// [DefaultMaxAge].
//
// Verify does not remember requests: to reject a replay inside maxAge,
// deduplicate by the Outbox-Event-Id header (or the envelope's "id", which
// the signature covers), which receivers need for at-least-once delivery
// anyway.
func Verify(secret []byte, header http.Header, body []byte, maxAge time.Duration) error {
	return verify(secret, header, body, maxAge, time.Now())
}

func verify(secret []byte, header http.Header, body []byte, maxAge time.Duration, now time.Time) error {
	if len(secret) == 0 {
		return fmt.Errorf("%w: empty secret", ErrInvalidSignature)
	}
	if maxAge <= 0 {
		maxAge = DefaultMaxAge
	}
	ts := header.Get(HeaderTimestamp)
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return fmt.Errorf("%w: %s is missing or not Unix seconds", ErrStaleTimestamp, HeaderTimestamp)
	}
	// Check the signature first: an attacker cannot learn anything from
	// which check failed, and a forged request is reported as forged.
	sig, ok := strings.CutPrefix(header.Get(HeaderSignature), signaturePrefix)
	if !ok {
		return fmt.Errorf("%w: %s is missing or not %q followed by hex", ErrInvalidSignature, HeaderSignature, signaturePrefix)
	}
	got, err := hex.DecodeString(sig)
	if err != nil || !hmac.Equal(got, mac(secret, ts, body)) {
		return ErrInvalidSignature
	}
	age := now.Sub(time.Unix(sec, 0))
	if age > maxAge || age < -maxAge {
		return fmt.Errorf("%w: timestamp is %v from now, over %v", ErrStaleTimestamp, age.Round(time.Second), maxAge)
	}
	return nil
}
