package webhook

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"runtime/debug"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/wire"
	"gorm.io/gorm"
)

// DefaultMaxBodyBytes is [ConsumerConfig.MaxBodyBytes]'s default: twice
// the core's default payload limit (1 MiB), so that an envelope carrying
// the largest payload an outbox accepts by default, plus its metadata, is
// never refused.
const DefaultMaxBodyBytes = 2 << 20

// ConsumerConfig configures a [Consumer]. Consumer and Handle are required.
type ConsumerConfig struct {
	// Consumer names this consumer in the inbox (outbox.Consume's consumer).
	Consumer string

	// Handle applies one message's effect inside the inbox transaction tx:
	// write through tx only. Its error decides the response, and so the
	// Sender's next step: nil is a 204 (delivered); an error marked with
	// [outbox.Permanent] is a 422 (the Sender fails the event at once);
	// one marked with [outbox.Unavailable] a 503 without Retry-After (the
	// Sender pauses delivery without counting an attempt); any other
	// error, or a panic, a 500 (the Sender retries with backoff). ctx is
	// the request's context, carrying the receive span when there is a
	// Telemetry.
	Handle func(ctx context.Context, tx *gorm.DB, m Message) error

	// MessageID returns the ID the inbox records for m. Defaults to
	// m.Event.ID, the event ID in every Format: the envelope's "id", the
	// CloudEvents id. A request signed with Standard Webhooks must then
	// carry it as its webhook-id too, which the signature covers (in the
	// CloudEvents binary mode the id travels in an unsigned ce-id header);
	// a mismatch is refused (400). Set MessageID for messages of other
	// producers. An empty ID is refused as permanent (400).
	MessageID func(m Message) string

	// Logger; defaults to slog.Default(). Payloads are never logged.
	Logger *slog.Logger

	// Secrets are further secrets a request may be signed with, besides
	// the one given to [NewConsumer]: while a secret is rotated, accept
	// the old and the new one (see [VerifyAny]). Defaults to none.
	Secrets [][]byte

	// MaxAge is the largest difference between a request's timestamp
	// (webhook-timestamp, or the 0.1 scheme's X-Outbox-Timestamp) and this
	// server's clock that is accepted (see [Verify]). Defaults to
	// [DefaultMaxAge], 5 minutes.
	MaxAge time.Duration

	// Telemetry reports each message applied as a CONSUMER span "process
	// {host}{path}" (messaging system "http", the consumer group the
	// Consumer name), a child of the trace context the message carries;
	// Handle runs in its context. Package outboxotel's Messaging() provides
	// one. Defaults to the Telemetry in the request's context, if any
	// (wire.ContextWithTelemetry): without one, no span.
	Telemetry wire.Telemetry

	// MaxBodyBytes bounds a request's body; a larger one is answered 413,
	// which the Sender treats as permanent. Defaults to
	// [DefaultMaxBodyBytes].
	MaxBodyBytes int64
}

// Message is one request received: the outbox event decoded from it, in
// whichever [wire.Format] the Sender used, and the request itself.
type Message struct {
	// Event is the event the request carries: ID, type, aggregate,
	// idempotency key, occurred_at, headers and the payload as a
	// json.RawMessage, byte for byte as the Sender posted it. In
	// wire.Native it is the [Envelope]'s (its headers all the event's); in
	// the CloudEvents formats it is decoded by [wire.Decode], and its
	// headers are the CloudEvents extensions that are no event field
	// (traceparent, tracestate): other HTTP headers, forwarded event
	// headers among them, are in Raw.Header only.
	Event outbox.Event
	// Raw is the HTTP request. Its body has been read already; Raw.Body
	// reads the same bytes again.
	Raw *http.Request
}

// Consumer is the receiving end of a [Sender]: an [http.Handler] that
// verifies each request's signature, decodes its event (an envelope, or
// CloudEvents in either content mode) and runs
// [ConsumerConfig.Handle] through [outbox.Consume], so that an event
// delivered twice (a response lost, a relay restarted) has its effect once.
// It answers 2xx only after the effect has committed, or for a duplicate.
// Create it with [NewConsumer]; it is safe for concurrent use.
type Consumer struct {
	db        *gorm.DB
	secrets   [][]byte
	cfg       ConsumerConfig
	log       *slog.Logger
	defaultID bool // MessageID is m.Event.ID: checked against webhook-id
}

// beforeAck, when set (by tests only), runs after Consume returned nil and
// before the response is written: a test makes it drop the connection, as a
// crash between commit and acknowledgement would.
var beforeAck func(w http.ResponseWriter, r *http.Request)

// NewConsumer returns a handler that consumes the requests of a [Sender]
// signed with secret (or one of cfg.Secrets) into db, which must have the
// outbox plugin installed (it holds the inbox table). Mount it on the path
// the Sender posts to:
//
//	mux.Handle("POST /hooks/orders", c)
//
// It returns an error wrapping [outbox.ErrInvalidConfig] for a missing
// Consumer or Handle, an empty secret, a negative MaxAge or MaxBodyBytes,
// or a db without the plugin.
func NewConsumer(db *gorm.DB, secret []byte, cfg ConsumerConfig) (*Consumer, error) {
	switch {
	case db == nil || db.Config == nil || db.Config.Plugins["outbox"] == nil:
		return nil, fmt.Errorf("%w: outbox/webhook: NewConsumer needs a db with the outbox plugin installed (db.Use)", outbox.ErrInvalidConfig)
	case cfg.Consumer == "":
		return nil, fmt.Errorf("%w: outbox/webhook: ConsumerConfig.Consumer is empty", outbox.ErrInvalidConfig)
	case cfg.Handle == nil:
		return nil, fmt.Errorf("%w: outbox/webhook: ConsumerConfig.Handle is nil", outbox.ErrInvalidConfig)
	case len(secret) == 0:
		return nil, fmt.Errorf("%w: outbox/webhook: NewConsumer needs a non-empty secret to verify requests", outbox.ErrInvalidConfig)
	case cfg.MaxAge < 0:
		return nil, fmt.Errorf("%w: outbox/webhook: negative MaxAge %v; use 0 for the default", outbox.ErrInvalidConfig, cfg.MaxAge)
	case cfg.MaxBodyBytes < 0:
		return nil, fmt.Errorf("%w: outbox/webhook: negative MaxBodyBytes %d; use 0 for the default", outbox.ErrInvalidConfig, cfg.MaxBodyBytes)
	}
	secrets := [][]byte{bytes.Clone(secret)}
	for i, s := range cfg.Secrets {
		if len(s) == 0 {
			return nil, fmt.Errorf("%w: outbox/webhook: ConsumerConfig.Secrets[%d] is empty", outbox.ErrInvalidConfig, i)
		}
		secrets = append(secrets, bytes.Clone(s))
	}
	cfg.Secrets = nil
	cfg.MaxAge = cmp.Or(cfg.MaxAge, DefaultMaxAge)
	cfg.MaxBodyBytes = cmp.Or(cfg.MaxBodyBytes, DefaultMaxBodyBytes)
	defaultID := cfg.MessageID == nil
	if defaultID {
		cfg.MessageID = func(m Message) string { return m.Event.ID }
	}
	return &Consumer{
		db:        db,
		secrets:   secrets,
		cfg:       cfg,
		log:       cmp.Or(cfg.Logger, slog.Default()),
		defaultID: defaultID,
	}, nil
}

// ServeHTTP consumes one request:
//
//   - 405 for a method other than POST;
//   - 413 for a body over MaxBodyBytes;
//   - 401 for a missing or bad signature, or a timestamp older (or newer)
//     than MaxAge;
//   - 400 for a body that is neither an envelope nor a CloudEvents
//     message, a message without an ID, or (with the default MessageID)
//     an event ID that is not the request's webhook-id;
//   - then Handle runs through [outbox.Consume]: 204 once it committed, or
//     at once for a message already consumed; 422 for an
//     [outbox.Permanent] error (or an ID the inbox cannot hold); 503 for an
//     [outbox.Unavailable] one; 500 for any other error or a panic.
//
// The Sender treats every 4xx here as permanent (the event fails at once)
// and retries after a 5xx, so a message is redelivered exactly when
// retrying can help.
func (c *Consumer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	ctx := r.Context()
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, c.cfg.MaxBodyBytes))
	if err != nil {
		if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
			c.log.ErrorContext(ctx, "outbox/webhook: request body too large; refused", c.attrs(r, "")...)
			http.Error(w, "request body too large", http.StatusRequestEntityTooLarge)
			return
		}
		// The client went away mid-body, or sent a broken chunked body.
		c.log.WarnContext(ctx, "outbox/webhook: reading the request body failed", append(c.attrs(r, ""), slog.Any("error", err))...)
		http.Error(w, "cannot read the request body", http.StatusBadRequest)
		return
	}
	if err := c.verify(r.Header, body, time.Now()); err != nil {
		c.log.WarnContext(ctx, "outbox/webhook: request refused", append(c.attrs(r, ""), slog.Any("error", err))...)
		http.Error(w, "invalid signature or timestamp", http.StatusUnauthorized)
		return
	}
	e, err := decode(r.Header, body)
	if err != nil {
		c.log.ErrorContext(ctx, "outbox/webhook: request body is neither an envelope nor a CloudEvents message; refused", append(c.attrs(r, ""), slog.Any("error", err))...)
		http.Error(w, "body is not an outbox envelope or a CloudEvents message", http.StatusBadRequest)
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	m := Message{Event: e, Raw: r}
	id := c.cfg.MessageID(m)
	if id == "" {
		c.log.ErrorContext(ctx, "outbox/webhook: message has no ID; refused (the Consumer needs the Sender's envelope, not PayloadOnly)", c.attrs(r, e.Type)...)
		http.Error(w, "message has no ID", http.StatusBadRequest)
		return
	}
	webhookID := r.Header.Get(HeaderWebhookID)
	if c.defaultID && webhookID != "" && webhookID != id {
		// The signature covers webhook-id, not necessarily the event ID
		// (a ce-id header): a replay with another ce-id would be applied
		// again.
		c.log.ErrorContext(ctx, "outbox/webhook: the event ID is not the signed webhook-id; refused", c.attrs(r, e.Type)...)
		http.Error(w, "event ID does not match webhook-id", http.StatusBadRequest)
		return
	}
	ctx, end := wire.StartReceive(ctx, c.cfg.Telemetry, wire.Operation{
		System:        "http",
		Destination:   r.Host, // not the path: it may hold a token
		MessageID:     webhookID,
		ConsumerGroup: c.cfg.Consumer,
	}, e)
	err = c.consume(ctx, id, m)
	end(err)
	attrs := append(c.attrs(r, e.Type), slog.String("message_id", id))
	switch {
	case err == nil:
		if beforeAck != nil {
			beforeAck(w, r)
		}
		w.WriteHeader(http.StatusNoContent)
	case outbox.IsPermanent(err) || errors.Is(err, outbox.ErrInvalidEvent) || errors.Is(err, outbox.ErrInvalidInboxID):
		c.log.ErrorContext(ctx, "outbox/webhook: message failed permanently; refused", append(attrs, slog.Any("error", err))...)
		http.Error(w, "message refused", http.StatusUnprocessableEntity)
	case outbox.IsUnavailable(err):
		c.log.WarnContext(ctx, "outbox/webhook: consumer unavailable; the sender will retry", append(attrs, slog.Any("error", err))...)
		http.Error(w, "temporarily unavailable", http.StatusServiceUnavailable)
	case errors.As(err, new(*panicError)):
		c.log.ErrorContext(ctx, "outbox/webhook: Handle panicked; the sender will retry", append(attrs, slog.Any("error", err))...)
		http.Error(w, "handling failed", http.StatusInternalServerError)
	default:
		c.log.WarnContext(ctx, "outbox/webhook: handling the message failed; the sender will retry", append(attrs, slog.Any("error", err))...)
		http.Error(w, "handling failed", http.StatusInternalServerError)
	}
}

// consume runs Handle through outbox.Consume, turning a panic into an
// error: left to net/http, it would drop the connection, which the Sender
// takes for an outage rather than for a failure of this message.
func (c *Consumer) consume(ctx context.Context, id string, m Message) (err error) {
	defer func() {
		if v := recover(); v != nil {
			if v == http.ErrAbortHandler {
				panic(v)
			}
			err = &panicError{v: v, stack: debug.Stack()}
		}
	}()
	return outbox.Consume(c.db.WithContext(ctx), c.cfg.Consumer, id, func(tx *gorm.DB) error {
		return c.cfg.Handle(ctx, tx, m)
	})
}

// panicError is a panic of Handle, recovered.
type panicError struct {
	v     any
	stack []byte
}

func (e *panicError) Error() string { return fmt.Sprintf("Handle panicked: %v\n%s", e.v, e.stack) }

// verify checks the request's signature and timestamp against every secret
// accepted: nil if one of them verifies it.
func (c *Consumer) verify(header http.Header, body []byte, now time.Time) error {
	return verify(c.secrets, header, body, c.cfg.MaxAge, now)
}

// decode reads the event of a request in any Format: CloudEvents
// structured mode by its Content-Type, binary mode by a ce-specversion
// header (in a request without Outbox-Event-Id: a Native request may
// forward an event header of that name), else a Native envelope. Only the
// content type and the ce-* headers are given to wire.Decode: the other
// HTTP headers (User-Agent, Authorization, the signature) are not the
// event's.
func decode(h http.Header, body []byte) (outbox.Event, error) {
	ct := h.Get("Content-Type")
	mt, _, _ := mime.ParseMediaType(ct)
	binary := h.Get("Ce-Specversion") != "" && h.Get(wire.EventID) == ""
	if mt != wire.ContentTypeCloudEventsJSON && !binary {
		return decodeEnvelope(body)
	}
	headers := map[string]string{"Content-Type": ct}
	if binary && mt != wire.ContentTypeCloudEventsJSON {
		for k, vs := range h {
			if attributeHeader(k) && len(vs) > 0 {
				headers[k] = vs[0]
			}
		}
	}
	e, err := wire.Decode(headers, body)
	if err != nil {
		// The decoder's error may quote the body; name its kind only.
		var se *json.SyntaxError
		var te *json.UnmarshalTypeError
		switch {
		case errors.As(err, &se):
			err = fmt.Errorf("CloudEvents JSON: invalid JSON at offset %d", se.Offset)
		case errors.As(err, &te):
			err = fmt.Errorf("CloudEvents JSON: not an object (%s)", te.Value)
		}
		return outbox.Event{}, err
	}
	return e, nil
}

// decodeEnvelope reads a Sender's envelope back into the event it carries.
func decodeEnvelope(body []byte) (outbox.Event, error) {
	var env Envelope
	if err := json.Unmarshal(body, &env); err != nil {
		// The decoder's error may quote the body; name its kind only.
		var se *json.SyntaxError
		var te *json.UnmarshalTypeError
		switch {
		case errors.As(err, &se):
			return outbox.Event{}, fmt.Errorf("invalid JSON at offset %d", se.Offset)
		case errors.As(err, &te):
			return outbox.Event{}, fmt.Errorf("envelope field %q has the wrong type", te.Field)
		}
		return outbox.Event{}, errors.New("invalid envelope")
	}
	return outbox.Event{
		ID:             env.ID,
		Type:           env.Type,
		AggregateType:  env.AggregateType,
		AggregateID:    env.AggregateID,
		IdempotencyKey: env.IdempotencyKey,
		OccurredAt:     env.OccurredAt,
		Headers:        env.Headers,
		Payload:        env.Payload,
	}, nil
}

// attrs are the identifiers logged for a request: never its body.
func (c *Consumer) attrs(r *http.Request, eventType string) []any {
	a := []any{slog.String("consumer", c.cfg.Consumer), slog.String("remote_addr", r.RemoteAddr)}
	if id := cmp.Or(r.Header.Get(wire.EventID), r.Header.Get(HeaderWebhookID)); id != "" {
		a = append(a, slog.String("event_id", id)) // unsigned: as claimed
	}
	if eventType != "" {
		a = append(a, slog.String("event_type", eventType))
	}
	return a
}
