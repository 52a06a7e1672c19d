// Package webhook delivers outbox events as signed HTTP POST requests. It
// uses the standard library only.
//
// Delivery guarantee: at least once; a request whose response is lost (a
// timeout after the receiver acted, a relay crash before "mark sent") is sent
// again, so receivers deduplicate by the webhook-id header (the event ID,
// also Outbox-Event-Id and the envelope's "id" in Native format).
//
// # Request
//
// In the default [wire.Native] format the body is an [Envelope]: the
// event's ID, type, aggregate, idempotency key, occurred_at, headers and
// JSON payload in one signed document, so that a receiver gets the metadata
// under the signature. Set [Config.PayloadOnly] to post the bare payload
// instead. The request carries:
//
//	Content-Type: application/json
//	Outbox-Event-Id: <event ID>
//	Outbox-Event-Type: <event type>
//	Outbox-Aggregate-Type: <aggregate type, when set>
//	Outbox-Aggregate-Id: <aggregate ID, when set>
//	Outbox-Idempotency-Key: <idempotency key>
//	Idempotency-Key: <idempotency key>
//	Outbox-Occurred-At: <OccurredAt, RFC 3339, UTC, microseconds>
//	webhook-id, webhook-timestamp, webhook-signature (see Signatures)
//
// plus the event headers named in [Config.ForwardHeaders] (traceparent,
// tracestate and baggage by default) and any static [Config.Header].
//
// The Outbox-* headers are those of every outbox adapter, built by
// [wire.Headers]; neither an event header nor Config.Header can set them.
// They are not signed (the envelope's copies are). An Outbox-* value that is
// not a valid HTTP header value is left out, except the event ID and type.
//
// # Formats
//
// [Config.Format] picks the layout; every format is signed the same way.
//
//   - [wire.Native] (the default): as above, the request of release 0.1.
//   - [wire.CloudEvents]: CloudEvents 1.0, the HTTP protocol binding's
//     binary content mode. The attributes are ce-* headers (ce-specversion,
//     ce-id, ce-source, ce-type, ce-subject "{aggregate type}/{aggregate
//     ID}", ce-time, and the extensions ce-aggregatetype, ce-aggregateid,
//     ce-idempotencykey when it is not the ID, ce-traceparent,
//     ce-tracestate), percent-encoded as the binding asks; Content-Type
//     application/json (the datacontenttype); the body is the payload,
//     byte for byte. No Outbox-* headers, no envelope.
//   - [wire.CloudEventsJSON]: the binding's structured content mode. The
//     body is one CloudEvents JSON document (the same attributes as
//     members, the payload as "data"); Content-Type
//     application/cloudevents+json.
//
// In both CloudEvents formats the source attribute is [Config.Source]
// ([wire.DefaultSource] when empty), Idempotency-Key and the forwarded
// event headers are sent as in Native, and an event header that is not
// forwarded does not reach the receiver (there is no envelope to carry
// it). PayloadOnly is for Native only. The [Consumer] reads all three
// formats.
//
// # Signatures
//
// By default ([StandardWebhooks]) a request is signed as the Standard
// Webhooks specification asks, so that its libraries verify it:
//
//	webhook-id: <event ID, the same on every retry>
//	webhook-timestamp: <Unix seconds when this attempt was sent>
//	webhook-signature: v1,<base64 HMAC-SHA256(key, id + "." + timestamp + "." + body)>
//
// The secret given to [New] is the raw key; Standard Webhooks receivers
// write it as "whsec_" and its base64 ([EncodeSecret]). To rotate a key,
// give the Sender the new one in [Config.Secrets]: webhook-signature then
// holds one space-separated v1 entry per key, and a receiver with either
// key accepts the request. [Config.Signature] [XOutboxSignature] signs as
// release 0.1 did instead:
//
//	X-Outbox-Timestamp: <Unix seconds when this attempt was sent>
//	X-Outbox-Signature: sha256=<hex HMAC-SHA256 of timestamp + "." + body>
//
// Every attempt is signed afresh, so a retry is never stale; receivers
// check the signature and the timestamp's age with [Verify] (or
// [VerifyAny], for several secrets), which accepts either scheme and
// defeats replays older than its max age, and deduplicate by event ID
// within it. A Go receiver with the outbox plugin on its database can
// mount a [Consumer] ([NewConsumer]) instead: it verifies, decodes any
// format, applies each event once through the inbox and answers with the
// status codes the Sender expects.
//
// # Telemetry
//
// Each request is reported to a [wire.Telemetry] as a send (messaging
// system "http", destination the URL's host: never its path or query,
// which often hold a token)
// and carries that span's trace context: the traceparent header when
// forwarded, the envelope's headers, the ce-traceparent extension. The
// spans come from package outboxotel, whose Instrument hands its
// Telemetry to the handler in ctx: [Config.Telemetry] is only to override
// it. A [Consumer] runs outside any delivery: give it one in
// [ConsumerConfig.Telemetry] (outboxotel.Messaging()) for its receive
// spans. A URL whose path holds a token (as some chat services' webhook
// URLs do) puts it in the spans.
//
// # Outcome
//
// A 2xx response is success. Any other 4xx than 408 and 429, and a 3xx
// (redirects are not followed: a signed body is not re-posted to another
// address), is a permanent failure ([outbox.Permanent]): the relay fails the
// event at once. 5xx, 408, 429, timeouts and network errors are returned as
// plain errors, which the relay retries with backoff, or no sooner than a
// Retry-After header asks (capped at an hour). Errors lead with their
// cause (the status, such as "410 Gone from POST https://host
// (outbox/webhook)", or the network error), then name the request by its
// method, scheme and host and the adapter; never the event ID (the relay's
// logs and the outbox row carry it), the URL's path or query (which may
// hold a token), the payload or the response body.
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
// # Registering
//
// [Sender.AsyncHandler], registered with [outbox.Outbox.HandleAsync], is
// the default: the relay starts the requests of a whole batch (with
// [outbox.RelayConfig.OrderByAggregate], of a wave: the next event of each
// aggregate), in batch order, before it waits for any response, and the
// Sender keeps up to [Config.MaxInFlight] of them in flight to its
// endpoint, so a batch costs about one round trip per MaxInFlight events
// instead of one per event and per relay worker. [Sender.Handler],
// registered with [outbox.Outbox.Handle], posts an event and waits for its
// response before it returns: a relay has at most its Workers requests in
// flight. Both send the same requests, report the same telemetry and
// return the same errors.
//
// Ordering: requests to the endpoint overlap (up to MaxInFlight with
// AsyncHandler, up to the relay's Workers with Handler), a retried event
// arrives after those sent meanwhile, and several relays interleave, so
// receivers must not rely on arrival order. With OrderByAggregate a relay
// posts an aggregate's next event only once the previous one's response
// was a 2xx, so an aggregate's events arrive one at a time, in order, and
// none after one that was not delivered.
package webhook

import (
	"bytes"
	"cmp"
	"context"
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
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/wire"
)

// Defaults.
const (
	// DefaultTimeout is [Config.Timeout]'s default.
	DefaultTimeout = 10 * time.Second
	// DefaultMaxInFlight is [Config.MaxInFlight]'s default.
	DefaultMaxInFlight = 16
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
	// redirects. A Client of your own should keep MaxInFlight idle
	// connections to the endpoint (its http.Transport's
	// MaxIdleConnsPerHost, which defaults to 2): else most of the
	// connections AsyncHandler opens for a batch are closed after it and
	// opened again for the next. Defaults to a client on a copy of
	// http.DefaultTransport that keeps MaxInFlight idle connections per
	// host, shared by the Senders with the same MaxInFlight (made when
	// [New] makes the first of them).
	Client *http.Client

	// Timeout bounds one request, response headers and body drain included,
	// from the moment it is sent (with [Sender.AsyncHandler], once one of
	// the MaxInFlight places is free); the relay's deadline applies too.
	// Defaults to 10 seconds.
	Timeout time.Duration

	// MaxInFlight bounds the requests [Sender.AsyncHandler] has in flight
	// to the Sender's endpoint at once, for all the relays sharing the
	// Sender: a start beyond it waits, within its context, for one of them
	// to end, so that requests are sent in the order they were started.
	// Over HTTP/1.1 each request in flight holds a connection of its
	// own. 16 is four times the requests a relay had in flight with
	// Handler at its default 4 Workers, enough for about 300 events a
	// second to an endpoint 50 ms away, and few enough connections for a
	// receiver sized for a handful of clients (a small worker pool, a
	// proxy's per-client limit). Requests made by [Sender.Handler] do not
	// count. Defaults to 16.
	MaxInFlight int

	// Format is the request's layout: [wire.Native] (the default) posts an
	// [Envelope] (or the bare payload, see PayloadOnly) with the Outbox-*
	// headers; [wire.CloudEvents] is the CloudEvents HTTP binding's binary
	// mode (ce-* headers, the payload as the body); [wire.CloudEventsJSON]
	// its structured mode (one application/cloudevents+json document). See
	// the package doc's Formats. [New] refuses any other value with an
	// error wrapping [wire.ErrFormat].
	Format wire.Format

	// Source is the CloudEvents source attribute in the CloudEvents
	// formats: one URI-reference per producing service, such as "/orders",
	// so that a receiver of several services' events can tell them apart.
	// Keep it stable: receivers may deduplicate by source and id. Defaults
	// to [wire.DefaultSource]. Unused in wire.Native.
	Source string

	// Telemetry reports each request as a PRODUCER span "send {host}{path}"
	// (messaging system "http") whose trace context the request carries.
	// Defaults to the Telemetry in the handler's ctx, which
	// outboxotel.Instrument puts there for every delivery; set it only to
	// override that one.
	Telemetry wire.Telemetry

	// Signature is the signing scheme: [StandardWebhooks] (the default:
	// webhook-id, webhook-timestamp, webhook-signature) or
	// [XOutboxSignature] (release 0.1's X-Outbox-Timestamp and
	// X-Outbox-Signature, for receivers still checking those). [Verify]
	// accepts both.
	Signature Scheme

	// Secrets are further keys the Sender signs every request with, besides
	// the one given to [New], each adding a v1 entry to webhook-signature:
	// to rotate a key, sign with the old and the new one until every
	// receiver has the new one. [StandardWebhooks] only: New refuses
	// Secrets with XOutboxSignature, which has room for one signature.
	// Defaults to none.
	Secrets [][]byte

	// PayloadOnly posts the event's JSON payload as the body instead of an
	// [Envelope]; the metadata is then only in the Outbox-* headers.
	// wire.Native only (the CloudEvents formats have no envelope): New
	// refuses it with another Format. Defaults to false (the envelope).
	PayloadOnly bool

	// Header is added to every request, for example an Authorization
	// header the receiver requires. It cannot override the signature
	// headers (webhook-*, X-Outbox-*), Content-Type or, in the CloudEvents
	// formats, a ce-* attribute; its entries with the reserved Outbox-*
	// names of package wire are ignored. Defaults to none.
	Header http.Header

	// ForwardHeaders names the event headers that are also sent as HTTP
	// headers, so the receiver's tracing middleware picks them up. Names
	// are matched case-insensitively; a value that is not a valid HTTP
	// header value is not forwarded. In wire.Native all event headers are
	// in the envelope regardless; in the CloudEvents formats an event
	// header reaches the receiver only when forwarded (traceparent and
	// tracestate also travel as the traceparent and tracestate
	// extensions). Defaults to traceparent, tracestate and baggage.
	ForwardHeaders []string
}

// Sender posts outbox events to one URL. Create it with [New]; it is safe for
// concurrent use.
type Sender struct {
	url     string
	target  string // "POST scheme://host": the request as errors name it
	secrets [][]byte
	client  *http.Client
	cfg     Config
	forward []string
	op      wire.Operation
	slots   chan struct{} // AsyncHandler's requests in flight, MaxInFlight at most
}

// New returns a sender that posts events to endpoint (an http or https URL),
// signed with secret, the raw key bytes (a Standard Webhooks receiver is
// configured with the same key as text, [EncodeSecret]'s
// "whsec_<base64>"; [DecodeSecret] reads that form back). Share the secret
// with the receiver, which checks requests with [Verify] or any Standard
// Webhooks verifier.
//
// New refuses an unknown Format (the error wraps [wire.ErrFormat]) or
// Signature, PayloadOnly with a CloudEvents Format, Secrets with the
// XOutboxSignature scheme or with an empty key, and a negative Timeout or
// MaxInFlight.
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
	if cfg.MaxInFlight < 0 {
		return nil, fmt.Errorf("outbox/webhook: negative MaxInFlight %d; use 0 for the default", cfg.MaxInFlight)
	}
	if err := cfg.Format.Check(); err != nil {
		return nil, fmt.Errorf("outbox/webhook: Config.Format: %w", err)
	}
	if err := wire.CheckSource(cfg.Source); err != nil {
		return nil, fmt.Errorf("outbox/webhook: Config.Source: %w", err)
	}
	if cfg.PayloadOnly && cfg.Format != wire.Native {
		return nil, fmt.Errorf("outbox/webhook: Config.PayloadOnly is for wire.Native only: %v has no envelope to leave out (its body is the payload or the CloudEvents document)", cfg.Format)
	}
	switch cfg.Signature {
	case StandardWebhooks:
	case XOutboxSignature:
		if len(cfg.Secrets) > 0 {
			return nil, errors.New("outbox/webhook: Config.Secrets needs the StandardWebhooks Signature: XOutboxSignature carries one signature")
		}
	default:
		return nil, fmt.Errorf("outbox/webhook: unknown Config.Signature %v (use webhook.StandardWebhooks or webhook.XOutboxSignature)", cfg.Signature)
	}
	secrets := [][]byte{bytes.Clone(secret)}
	for i, s := range cfg.Secrets {
		if len(s) == 0 {
			return nil, fmt.Errorf("outbox/webhook: Config.Secrets[%d] is empty", i)
		}
		secrets = append(secrets, bytes.Clone(s))
	}
	cfg.Secrets = nil
	cfg.Timeout = cmp.Or(cfg.Timeout, DefaultTimeout)
	cfg.MaxInFlight = cmp.Or(cfg.MaxInFlight, DefaultMaxInFlight)
	cfg.Header = cfg.Header.Clone()

	client := &http.Client{Transport: transport(cfg.MaxInFlight)}
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
		target:  http.MethodPost + " " + u.Scheme + "://" + u.Host,
		secrets: secrets,
		client:  client,
		cfg:     cfg,
		forward: forward,
		op:      operation(u),
		slots:   make(chan struct{}, cfg.MaxInFlight),
	}, nil
}

// transports are the default Clients' transports, one per MaxInFlight,
// shared by the Senders as http.DefaultTransport was: a program that
// makes many Senders does not get a connection pool for each.
var transports struct {
	sync.Mutex
	m map[int]http.RoundTripper
}

// transport is the default Client's: http.DefaultTransport's settings,
// keeping as many idle connections per host as AsyncHandler has requests
// in flight. With net/http's default of 2, a relay sending over 16
// connections closed 14 after each batch and opened them again for the
// next: about 1,000 connections for 5,000 events to a local endpoint, a
// TCP and often a TLS handshake each, instead of 16 (and Handler at 4
// Workers about 100 instead of 4).
func transport(maxInFlight int) http.RoundTripper {
	transports.Lock()
	defer transports.Unlock()
	if t, ok := transports.m[maxInFlight]; ok {
		return t
	}
	base, ok := http.DefaultTransport.(*http.Transport)
	if !ok {
		return http.DefaultTransport // the program's own: used as it is
	}
	t := base.Clone()
	t.MaxIdleConnsPerHost = maxInFlight
	t.MaxIdleConns = max(t.MaxIdleConns, maxInFlight)
	if transports.m == nil {
		transports.m = map[int]http.RoundTripper{}
	}
	transports.m[maxInFlight] = t
	return t
}

// operation is what the Telemetry is told of every request: the URL's
// host, never its path or query, which often hold a token (Slack's and
// Discord's webhook URLs do) that spans must not carry.
func operation(u *url.URL) wire.Operation {
	port, _ := strconv.Atoi(u.Port())
	if port == 0 {
		port = map[string]int{"http": 80, "https": 443}[u.Scheme]
	}
	return wire.Operation{
		System:        "http",
		Destination:   u.Host,
		ServerAddress: u.Hostname(),
		ServerPort:    port,
	}
}

// StatusError is the error for a response outside 2xx. It is wrapped with
// [outbox.Permanent] when retrying cannot help, and with
// [outbox.Unavailable] for a 502, 503 or 504 without Retry-After (see the
// package doc).
type StatusError struct {
	// StatusCode is the response's HTTP status.
	StatusCode int
}

// Error returns the status, such as "503 Service Unavailable" ("status
// 599" for a code without a standard text).
func (e *StatusError) Error() string {
	if text := http.StatusText(e.StatusCode); text != "" {
		return fmt.Sprintf("%d %s", e.StatusCode, text)
	}
	return fmt.Sprintf("status %d", e.StatusCode)
}

// Handler returns the outbox handler that posts each event it is given and
// waits for the response: register it with ob.Handle(eventType,
// s.Handler()). A relay then has at most its Workers requests in flight.
// [Sender.AsyncHandler] sends the same requests and returns the same errors
// without holding a relay worker for each.
func (s *Sender) Handler() outbox.Handler {
	return func(ctx context.Context, e outbox.Event) error {
		return s.start(ctx, e, false)()
	}
}

// AsyncHandler returns the outbox handler that starts posting each event
// it is given and returns a wait for the response: register it with
// ob.HandleAsync(eventType, s.AsyncHandler()). A relay starts the requests
// of a batch (with OrderByAggregate, of a wave: the next event of each
// aggregate) in batch order, then waits for each, so that up to
// [Config.MaxInFlight] requests are in flight to the endpoint instead of
// one per relay worker.
//
// The request, its signature, the telemetry (the send span starts with the
// start and ends when wait returns, with its outcome) and the errors are
// those of [Sender.Handler]: wait returns nil for a 2xx and the error
// Handler would return otherwise. The start builds the request and sends
// it on a goroutine of its own, which ends with the request; when
// MaxInFlight requests of the Sender are in flight already, the start
// first waits for one of them to end. If ctx is done before one does, the
// event is not sent and wait returns the error of a request that could not
// reach the endpoint ([outbox.Unavailable] once ctx's deadline has passed,
// a plain error when ctx was cancelled), as Handler does when ctx ends
// before it connects. The request is bound to ctx (and to
// [Config.Timeout]), so wait returns soon after ctx is done. wait may be
// called more than once, from any goroutine; the request runs to its end
// whether or not it is.
func (s *Sender) AsyncHandler() outbox.AsyncHandler {
	return func(ctx context.Context, e outbox.Event) func() error {
		return s.start(ctx, e, true)
	}
}

// start is one delivery of e, Handler's (async false: the request is made
// before start returns) or AsyncHandler's (on a goroutine of its own, once
// one of the MaxInFlight places is free), and returns the wait for its
// classified outcome, which ends the send span.
func (s *Sender) start(ctx context.Context, e outbox.Event, async bool) (wait func() error) {
	// The span starts before anything can fail, so that it records every
	// outcome; the request is built from the event StartSend returns: its
	// trace context is the send span's.
	ctx, e, end := wire.StartSend(ctx, s.cfg.Telemetry, s.op, e)
	d := &delivery{done: make(chan struct{}), end: end}
	msg, err := s.message(e)
	switch {
	case err != nil:
		d.finish(outbox.Permanent(s.deliveryError(err)))
	case !async:
		d.finish(s.post(ctx, e, msg))
	default:
		select {
		case s.slots <- struct{}{}:
			go func() {
				err := s.post(ctx, e, msg)
				<-s.slots
				d.finish(err)
			}()
		case <-ctx.Done():
			// Not sent: what the request would have failed with had it
			// been made now, without a connection to the receiver.
			d.finish(s.requestError(ctx.Err(), false))
		}
	}
	return d.wait
}

// delivery is the outcome of one request, once done is closed.
type delivery struct {
	done chan struct{}
	err  error
	end  func(error) // the send span's
	once sync.Once
}

func (d *delivery) finish(err error) {
	d.err = err
	close(d.done)
}

func (d *delivery) wait() error {
	<-d.done
	d.once.Do(func() { d.end(d.err) })
	return d.err
}

// post sends msg, the event e laid out, and returns the classified
// outcome: nil for a 2xx (see the package doc).
func (s *Sender) post(ctx context.Context, e outbox.Event, msg wire.Message) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	// Whether a connection to the receiver was made tells an endpoint that
	// cannot be reached from one that was slow to answer.
	var connected atomic.Bool
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		GotConn: func(httptrace.GotConnInfo) { connected.Store(true) },
	})
	req, err := s.request(ctx, e, msg)
	if err != nil {
		return err
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return s.requestError(err, connected.Load())
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxDrain))
	_ = resp.Body.Close()
	return s.statusError(resp)
}

// request builds the POST of msg, the event e laid out, with its headers
// and signature.
func (s *Sender) request(ctx context.Context, e outbox.Event, msg wire.Message) (*http.Request, error) {
	body := msg.Body
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url, bytes.NewReader(body))
	if err != nil {
		// NewRequest's error may quote the URL, which may hold a token.
		return nil, outbox.Permanent(s.deliveryError(errors.New("cannot build the request")))
	}
	s.configHeaders(req.Header)
	if s.cfg.Format == wire.Native {
		s.nativeHeaders(req.Header, e)
	} else {
		s.bindingHeaders(req.Header, msg)
	}
	ts := strconv.FormatInt(time.Now().Unix(), 10)
	if key := cmp.Or(e.IdempotencyKey, e.ID); validHeaderValue(key) {
		// The de facto standard name, which receivers' middleware knows,
		// and which lets net/http resend the request on a fresh connection
		// when a kept-alive one turns out to have been closed by the
		// receiver (a restart, an idle timeout) instead of failing it.
		req.Header.Set("Idempotency-Key", key)
	}
	req.Header.Set("Content-Type", msg.ContentType)
	s.sign(req.Header, e.ID, ts, body)
	return req, nil
}

// configHeaders sets Config.Header on h, but for the names the event's
// headers, the signature or the CloudEvents attributes own, and the
// default User-Agent.
func (s *Sender) configHeaders(h http.Header) {
	for k, vs := range s.cfg.Header {
		if !wire.Reserved(k) && !signatureHeader(k) && !(s.cfg.Format == wire.CloudEvents && attributeHeader(k)) {
			h[k] = append([]string(nil), vs...)
		}
	}
	if h.Get("User-Agent") == "" {
		h.Set("User-Agent", "gorm-outbox-webhook/1")
	}
}

// nativeHeaders sets the event's headers of wire.Native on h.
func (s *Sender) nativeHeaders(h http.Header, e outbox.Event) {
	wire.Headers(e, func(k, v string) {
		switch {
		case k == wire.EventID || k == wire.EventType:
			// The receiver cannot do without them: a value net/http
			// refuses fails the request rather than going missing.
			h.Set(k, v)
		case !validHeaderValue(v):
			// Left out; the envelope carries it.
		case wire.Reserved(k) || (s.forwarded(k) && !signatureHeader(k)):
			h.Set(k, v)
		}
	})
}

// bindingHeaders sets the headers of msg, laid out by the CloudEvents HTTP
// binding, on h.
func (s *Sender) bindingHeaders(h http.Header, msg wire.Message) {
	for _, mh := range msg.Header {
		switch {
		case attributeHeader(mh.Name):
			// A CloudEvents attribute, percent-encoded: always a valid
			// header value. Event headers with the prefix were left
			// out by Encode.
			h.Set(mh.Name, mh.Value)
		case s.forwarded(mh.Name) && validHeaderValue(mh.Value) && !signatureHeader(mh.Name):
			h.Set(mh.Name, mh.Value)
		}
	}
}

// deliveryError is the error of a delivery that failed with err, before
// or while sending: err first, then the request and the adapter, such as
// "dial tcp 10.0.0.1:443: connect: connection refused: POST https://host
// (outbox/webhook)". Neither the event ID (the relay's logs and the row
// carry it) nor the URL's path or query (a token, at times) is in it.
func (s *Sender) deliveryError(err error) error {
	return fmt.Errorf("%w: %s (outbox/webhook)", err, s.target)
}

// requestError is the error of a request that failed without a response:
// Unavailable when the receiver was not reached.
func (s *Sender) requestError(err error, connected bool) error {
	// *url.Error quotes the whole URL, which may carry a token; name
	// the scheme and host only.
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	err = s.deliveryError(err)
	if unreachable(err, connected) {
		return outbox.Unavailable(err)
	}
	return err
}

// statusError is the error of the response resp: nil for a 2xx, else a
// StatusError, classified (see the package doc).
func (s *Sender) statusError(resp *http.Response) error {
	code := resp.StatusCode
	if code >= 200 && code < 300 {
		return nil
	}
	// "410 Gone from POST https://host (outbox/webhook)".
	err := fmt.Errorf("%w from %s (outbox/webhook)", &StatusError{StatusCode: code}, s.target)
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

// message lays e out in the Sender's Format. In wire.Native the headers
// are left to the caller (wire.Headers), the body is the envelope or the
// payload.
func (s *Sender) message(e outbox.Event) (wire.Message, error) {
	if s.cfg.Format != wire.Native {
		return wire.HTTPBinding.Encode(s.cfg.Format, e, wire.CloudEventOptions{Source: s.cfg.Source})
	}
	payload, err := e.PayloadJSON()
	if err != nil {
		return wire.Message{}, err
	}
	m := wire.Message{Body: payload, ContentType: wire.ContentTypeJSON}
	if !s.cfg.PayloadOnly {
		m.Body, err = envelope(e, payload)
	}
	return m, err
}

// sign sets the signature headers of the Sender's scheme on h.
func (s *Sender) sign(h http.Header, id, ts string, body []byte) {
	if s.cfg.Signature == XOutboxSignature {
		h.Set(HeaderTimestamp, ts)
		h.Set(HeaderSignature, sign(s.secrets[0], ts, body))
		return
	}
	sigs := make([]string, len(s.secrets))
	for i, k := range s.secrets {
		sigs[i] = SignStandardWebhooks(k, id, ts, body)
	}
	// The event ID, the same on every attempt, as the specification asks.
	// A value net/http refuses fails the request, as Outbox-Event-Id does.
	h.Set(HeaderWebhookID, id)
	h.Set(HeaderWebhookTimestamp, ts)
	h.Set(HeaderWebhookSignature, strings.Join(sigs, " "))
}

// signatureHeader reports whether name is one of the signature headers of
// either scheme, which neither Config.Header nor an event header sets.
func signatureHeader(name string) bool {
	for _, h := range [...]string{HeaderWebhookID, HeaderWebhookTimestamp, HeaderWebhookSignature, HeaderTimestamp, HeaderSignature} {
		if strings.EqualFold(name, h) {
			return true
		}
	}
	return false
}

// attributeHeader reports whether name is a CloudEvents attribute's
// header in the HTTP binding's binary mode (ce-*).
func attributeHeader(name string) bool {
	return len(name) > 3 && strings.EqualFold(name[:3], "ce-")
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
