// Package redis appends outbox events to Redis streams with XADD, and reads
// them back through a consumer group with [Consumer], which applies each
// entry once with [outbox.Consume] and acknowledges it after the commit.
//
// Delivery guarantee: at least once; a retried XADD (after a lost reply, a
// relay crash before "mark sent", or the client's own retry) appends a second
// entry, so consumers deduplicate by the entry's "id" field.
//
// Each event becomes one stream entry with the fields listed under
// [Publisher.Handler]. By default every event goes to the one stream
// "outbox:events": a single stream keeps the relay's delivery order across
// event types (a consumer group reads one stream, filtering on "type"),
// whereas a stream per type would split an aggregate's history over several
// keys. Use [Config.Stream] for another name or [Config.StreamFor] for a
// per-type or per-tenant layout.
//
// Ordering: the handler waits for each XADD, so a stream holds events in the
// order one relay delivers them (oldest first). A retried event lands after
// those delivered meanwhile, and several relays interleave.
//
// Outages: an XADD that fails because Redis cannot be reached or cannot take
// writes (connection refused, reset or closed, a timeout, DNS, the client
// or its pool closed or exhausted, LOADING, READONLY, MASTERDOWN,
// CLUSTERDOWN, BUSY, OOM, max clients, authentication) is reported as
// [outbox.Unavailable]: the relay hands the event back without counting an
// attempt and pauses delivery until Redis answers again.
//
// The package shares its name with go-redis; import it under another name,
// for example outboxredis.
package redis

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/wire"
	goredis "github.com/redis/go-redis/v9"
)

// Field names of a stream entry. Every entry has all of them.
const (
	// FieldID holds the event ID, the consumer's deduplication key.
	FieldID = "id"
	// FieldType holds the event type.
	FieldType = "type"
	// FieldAggregateType holds the aggregate type, "" when none.
	FieldAggregateType = "aggregate_type"
	// FieldAggregateID holds the aggregate ID, "" when none.
	FieldAggregateID = "aggregate_id"
	// FieldIdempotencyKey holds the publisher's idempotency key.
	FieldIdempotencyKey = "idempotency_key"
	// FieldOccurredAt holds when the event happened, formatted with
	// [wire.TimeFormat] (RFC 3339, UTC, microseconds), "" when not set.
	FieldOccurredAt = "occurred_at"
	// FieldHeaders holds the event's headers as a JSON object, "{}" when
	// there are none.
	FieldHeaders = "headers"
	// FieldPayload holds the event's JSON payload.
	FieldPayload = "payload"
)

// Defaults of [Config].
const (
	// DefaultStream is [Config.Stream]'s default.
	DefaultStream = "outbox:events"
	// DefaultTimeout is [Config.Timeout]'s default.
	DefaultTimeout = 5 * time.Second
)

// Client is the part of a go-redis client the adapter uses. *redis.Client,
// *redis.ClusterClient, *redis.Ring and redis.UniversalClient satisfy it.
type Client interface {
	// XAdd appends an entry to a stream.
	XAdd(ctx context.Context, a *goredis.XAddArgs) *goredis.StringCmd
}

// Config configures a [Publisher]. Its zero value is usable.
type Config struct {
	// Stream is the key of the stream every event is appended to when
	// StreamFor is nil. Defaults to "outbox:events".
	Stream string

	// StreamFor maps an event to its stream key, overriding Stream; for
	// example func(e outbox.Event) string { return "events:" + e.Type }.
	// An empty result fails the event permanently. Defaults to nil (use
	// Stream).
	StreamFor func(e outbox.Event) string

	// MaxLen caps each stream's length by trimming its oldest entries on
	// every XADD. Trimming is approximate ("MAXLEN ~"): Redis removes only
	// whole internal nodes, which is much cheaper, so the stream may hold
	// somewhat more than MaxLen entries. Defaults to 0: no trimming.
	MaxLen int64

	// ExactTrim makes MaxLen exact ("MAXLEN ="), at a higher cost per XADD.
	// Defaults to false (approximate).
	ExactTrim bool

	// Timeout bounds one XADD; the relay's deadline applies too. go-redis
	// honours context deadlines only on clients created with
	// Options.ContextTimeoutEnabled; otherwise its own ReadTimeout and
	// WriteTimeout bound the call. Defaults to 5 seconds.
	Timeout time.Duration
}

// Publisher appends outbox events to Redis streams. Create it with [New]; it
// is safe for concurrent use.
type Publisher struct {
	rdb Client
	cfg Config
}

// New returns a publisher that appends events through rdb.
func New(rdb Client, cfg Config) (*Publisher, error) {
	if rdb == nil {
		return nil, errors.New("outbox/redis: New needs a client (redis.NewClient(...))")
	}
	if cfg.MaxLen < 0 {
		return nil, fmt.Errorf("outbox/redis: negative MaxLen %d; use 0 for no trimming", cfg.MaxLen)
	}
	if cfg.Timeout < 0 {
		return nil, fmt.Errorf("outbox/redis: negative Timeout %v; use 0 for the default", cfg.Timeout)
	}
	cfg.Stream = cmp.Or(cfg.Stream, DefaultStream)
	cfg.Timeout = cmp.Or(cfg.Timeout, DefaultTimeout)
	return &Publisher{rdb: rdb, cfg: cfg}, nil
}

// Handler returns the outbox handler that appends each event it is given:
// register it with ob.Handle(eventType, p.Handler()).
//
// The entry's fields, always all present and in this order, are id, type,
// aggregate_type, aggregate_id, idempotency_key, occurred_at, headers and
// payload (see the Field constants). Its entry ID is assigned by Redis.
//
// An event that cannot be encoded, or whose stream key is empty, fails
// permanently ([outbox.Permanent]). Network errors and the Redis errors that
// say the server cannot take writes are [outbox.Unavailable] (see the
// package doc): the relay pauses without counting attempts. Other Redis
// errors (a key of another type, an ACL that forbids the key) are retried
// with backoff.
func (p *Publisher) Handler() outbox.Handler {
	return p.publish
}

func (p *Publisher) publish(ctx context.Context, e outbox.Event) error {
	stream := p.cfg.Stream
	if p.cfg.StreamFor != nil {
		stream = p.cfg.StreamFor(e)
	}
	if stream == "" {
		return outbox.Permanent(fmt.Errorf("outbox/redis: publish event %s: StreamFor returned an empty stream key", e.ID))
	}
	values, err := entry(e)
	if err != nil {
		return outbox.Permanent(fmt.Errorf("outbox/redis: publish event %s: %w", e.ID, err))
	}
	args := &goredis.XAddArgs{Stream: stream, ID: "*", Values: values}
	if p.cfg.MaxLen > 0 {
		args.MaxLen, args.Approx = p.cfg.MaxLen, !p.cfg.ExactTrim
	}
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	defer cancel()
	if err := p.rdb.XAdd(ctx, args).Err(); err != nil {
		down := unavailable(err)
		err = fmt.Errorf("outbox/redis: publish event %s to stream %s: %w", e.ID, stream, err)
		if down {
			return outbox.Unavailable(err)
		}
		return err
	}
	return nil
}

// unavailable reports whether err, as go-redis returned it, says that Redis
// cannot be reached or cannot take writes at all, rather than refusing this
// event.
func unavailable(err error) bool {
	for _, target := range []error{
		context.DeadlineExceeded, io.EOF, io.ErrUnexpectedEOF, net.ErrClosed,
		syscall.ECONNREFUSED, syscall.ECONNRESET, syscall.EPIPE,
		goredis.ErrClosed, goredis.ErrPoolTimeout, goredis.ErrPoolExhausted,
	} {
		if errors.Is(err, target) {
			return true
		}
	}
	if _, ok := errors.AsType[net.Error](err); ok {
		return true
	}
	return goredis.IsLoadingError(err) || goredis.IsReadOnlyError(err) || goredis.IsMasterDownError(err) ||
		goredis.IsClusterDownError(err) || goredis.IsMaxClientsError(err) || goredis.IsOOMError(err) ||
		goredis.IsAuthError(err) || strings.HasPrefix(err.Error(), "BUSY ")
}

func entry(e outbox.Event) ([]any, error) {
	payload, err := e.PayloadJSON()
	if err != nil {
		return nil, err
	}
	headers := []byte("{}")
	if len(e.Headers) > 0 {
		if headers, err = json.Marshal(e.Headers); err != nil {
			return nil, fmt.Errorf("encode headers: %w", err)
		}
	}
	var occurred string
	if !e.OccurredAt.IsZero() {
		occurred = e.OccurredAt.UTC().Format(wire.TimeFormat)
	}
	// A slice, not a map, so that every entry lists its fields in the same
	// order.
	return []any{
		FieldID, e.ID,
		FieldType, e.Type,
		FieldAggregateType, e.AggregateType,
		FieldAggregateID, e.AggregateID,
		FieldIdempotencyKey, e.IdempotencyKey,
		FieldOccurredAt, occurred,
		FieldHeaders, string(headers),
		FieldPayload, string(payload),
	}, nil
}
