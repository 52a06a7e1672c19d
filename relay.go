package outbox

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/gorm-outbox/outbox/internal/engine"
	"github.com/gorm-outbox/outbox/internal/maint"
	"github.com/gorm-outbox/outbox/internal/store"
	"github.com/gorm-outbox/outbox/internal/txhook"
	"gorm.io/gorm"
)

// RelayConfig configures a [Relay]. Its zero value is usable; negative
// values are an error from the Relay's methods.
type RelayConfig struct {
	// BatchSize is how many due events one claim takes. Larger batches
	// amortise the claim and mark statements. Defaults to 100, and then
	// grows through a backlog: after a full batch delivered in under 1s
	// (and an eighth of the lease budget), the next claim takes twice as
	// many events, up to 1000; after a slower full batch, half as many;
	// after one that was not full, 100 again. A BatchSize that is set is
	// every claim's size.
	BatchSize int

	// Workers is how many goroutines deliver a claimed batch concurrently;
	// handlers must be safe for concurrent use. Defaults to 4. With an
	// [AsyncHandler] registered, a batch goes out in waves (every start,
	// then every wait) and Workers bounds only the plain Handlers of a
	// wave.
	Workers int

	// PollInterval is how long an idle relay waits before looking for due
	// events again. On PostgreSQL a committed event normally wakes the relay
	// at once (LISTEN/NOTIFY), so the poll is only a fallback. Defaults to
	// 500ms.
	PollInterval time.Duration

	// MaxAttempts is how many delivery attempts an event gets before it is
	// marked failed. Defaults to 10.
	MaxAttempts int

	// Backoff returns how long to wait before retrying an event whose
	// attempt number attempt (1 for the first) failed. Defaults to
	// [DefaultBackoff].
	Backoff func(attempt int) time.Duration

	// Lease is how long a claim on a batch lasts. Other relays will not
	// deliver the batch's events while it is live; a relay that dies holding
	// it has its events claimed again once it expires. The lease is not
	// extended: handlers get a context deadline that ends before the lease
	// does, and the relay starts no delivery from a batch whose lease is
	// about to run out (the rest are handed back), so a live claim is never
	// delivered twice. Size it above your slowest handler. Defaults to 1
	// minute.
	Lease time.Duration

	// HandlerTimeout bounds one event's delivery (all its handlers), within
	// the lease. Defaults to the batch's lease budget: every delivery of a
	// batch ends by Lease less a fifth of it (at most 5s) from the claim,
	// 55s at the default Lease.
	HandlerTimeout time.Duration

	// StatementTimeout bounds each statement the relay runs (claim, mark,
	// release, retention), so a connection that went silent (a network
	// partition, a vanished host) fails fast and the relay reconnects
	// instead of hanging until TCP gives up. Defaults to 10 seconds, and
	// never more than Lease: a claim slower than its lease is useless.
	StatementTimeout time.Duration

	// OrderByAggregate delivers the events of one aggregate (same
	// AggregateType and non-empty AggregateID) one at a time, oldest first,
	// across all relays that set it: an event waits while an older event of
	// its aggregate is not yet sent. A failing event holds back only its own
	// aggregate; once it is failed, the rest of that aggregate waits until it
	// is replayed ([Outbox.Replay]) or removed. Events without an
	// AggregateID are not ordered. It costs a NOT EXISTS probe per claimed
	// row and an index (created by the relay unless
	// Config.DisableAutoMigrate is set) that every insert maintains.
	// Defaults to false.
	OrderByAggregate bool

	// WaitReplicas, on PostgreSQL, delivers a batch only once at least
	// this many standbys (pg_stat_replication) have flushed the WAL that
	// holds its events to disk, in every mode: a batch claimed from the
	// table, and in Logical mode a batch streamed from the slot (which,
	// held, goes to the table undelivered, due at once, and is gated
	// there again), so that a failover to one of them
	// cannot lose a delivered event's business row: with asynchronous
	// replication, the event whose transaction the standby never
	// received is not delivered from the old primary, and is lost
	// together with its business row (none of the two reaches the world).
	// It costs each batch the standbys' flush lag (about a millisecond
	// on a LAN) and a query every few milliseconds while waiting; while
	// fewer standbys are connected, delivery waits, and a batch not
	// flushed within StatementTimeout is handed back undelivered (Run
	// retries it). The relay's role must see other sessions' LSNs in
	// pg_stat_replication (pg_monitor, or a superuser). Other databases
	// refuse it (ErrInvalidConfig). Defaults to 0: deliver at once.
	WaitReplicas int

	// Name names the relay in [Stats] Relays, `outbox stats` and the
	// dashboard's relays panel, beside its host and process ID. Defaults
	// to the host's name and the process ID ("host:pid").
	Name string
}

// Outcome is what a delivery attempt came to ([Delivery]), or an entry
// of an event's history records ([HistoryEntry]).
type Outcome string

// The outcomes.
const (
	// OutcomeSent: delivered.
	OutcomeSent Outcome = "sent"
	// OutcomeRetry: failed; to be tried again after a backoff (the row
	// stays StatusPending).
	OutcomeRetry Outcome = "retry"
	// OutcomeFailed: failed for good, by a [Permanent] error or as the
	// last of RelayConfig.MaxAttempts attempts (StatusFailed).
	OutcomeFailed Outcome = "failed"
	// OutcomeHandedBack: the handler reported its destination down
	// ([Unavailable]): the event was handed back undelivered and the
	// attempt not counted.
	OutcomeHandedBack Outcome = "handed_back"
	// OutcomeReplayed, in a history only: set pending again by
	// [Outbox.Replay].
	OutcomeReplayed Outcome = "replayed"
	// OutcomeRetried, in a history only: made due at once by
	// [Outbox.RetryNow], while it waited for a retry.
	OutcomeRetried Outcome = "retried"
)

// Delivery describes one delivery attempt, for [Hooks.Delivered].
type Delivery struct {
	// Event is the event as its handlers received it.
	Event Event
	// Attempt is the attempt number, 1 for the first.
	Attempt int
	// Outcome is what the attempt came to, by the relay's one policy:
	// OutcomeSent, OutcomeRetry, OutcomeFailed or OutcomeHandedBack (in
	// Memory mode, which does not retry, OutcomeSent or OutcomeFailed).
	Outcome Outcome
	// Status is the row's status after the attempt: StatusSent,
	// StatusPending (a retry is scheduled, or handed back) or
	// StatusFailed.
	Status Status
	// Err is the handlers' error, nil when delivered.
	Err error
	// Duration is how long the handlers ran; with an [AsyncHandler], how
	// long the event's whole wave took.
	Duration time.Duration
	// Latency is the time from the event's INSERT to the end of this
	// attempt (by the relay's clock).
	Latency time.Duration
}

// Defaults of RelayConfig; each field's documentation states its own.
const (
	defaultBatchSize        = 100
	defaultMaxBatch         = 1000        // how far the default BatchSize grows through a backlog
	growQuick               = time.Second // a full batch quicker than this grows the next claim
	defaultWorkers          = 4
	defaultPollInterval     = 500 * time.Millisecond
	defaultMaxAttempts      = 10
	defaultLease            = time.Minute
	defaultStatementTimeout = 10 * time.Second
)

// DefaultBackoff is exponential with jitter: about 1s after the first failed
// attempt, doubling each time, capped at 10 minutes, each value drawn
// uniformly from its upper half so that retries of many events spread out.
func DefaultBackoff(attempt int) time.Duration {
	d := 10 * time.Minute
	if attempt < 1 {
		attempt = 1
	}
	if attempt <= 10 {
		d = min(d, time.Second<<(attempt-1))
	}
	return d/2 + rand.N(d/2+1)
}

// Relay delivers persistent events: it claims due rows, hands them to the
// handlers outside any transaction, and records each outcome. Any number of
// relays, in one process or many, can run against one table.
type Relay struct {
	o   *Outbox
	db  *gorm.DB
	cfg RelayConfig

	policy *engine.Policy
	table  *engine.Table
	stream stream // Logical mode's source of new events
	site   *site  // db's: the commits that wake this relay
	gate   *gate  // a RelayGroup's turns, which every batch takes; nil: none

	orderingMu   sync.Mutex
	orderingDone bool

	life relayLife // what the relay records of itself (heartbeat.go)
	// maxBatch is how far the claim grows through a backlog (engine.Loop's
	// MaxBatch): BatchSize when it was set.
	maxBatch int
}

// Relay returns a relay that delivers the events in db's outbox table to the
// handlers registered with [Outbox.Handle]. db must be the *gorm.DB the
// plugin is installed on (not a transaction). Start it with [Relay.Run], or
// drive it with [Relay.ProcessOnce].
//
// An invalid configuration (a negative value, an outbox that was never
// installed or keeps no table) is a nil relay and an error wrapping
// [ErrInvalidConfig] or the cause's sentinel.
func (o *Outbox) Relay(db *gorm.DB, cfg RelayConfig) (*Relay, error) {
	r := &Relay{o: o, db: db, cfg: cfg}
	r.cfg.BatchSize = cmp.Or(cfg.BatchSize, defaultBatchSize)
	r.maxBatch = r.cfg.BatchSize
	if cfg.BatchSize == 0 {
		r.maxBatch = defaultMaxBatch
	}
	r.cfg.Workers = cmp.Or(cfg.Workers, defaultWorkers)
	r.cfg.PollInterval = cmp.Or(cfg.PollInterval, defaultPollInterval)
	r.cfg.MaxAttempts = cmp.Or(cfg.MaxAttempts, defaultMaxAttempts)
	r.cfg.Lease = cmp.Or(cfg.Lease, defaultLease)
	r.cfg.StatementTimeout = min(cmp.Or(cfg.StatementTimeout, defaultStatementTimeout), r.cfg.Lease)
	if r.cfg.Backoff == nil {
		r.cfg.Backoff = DefaultBackoff
	}
	r.policy = &engine.Policy{
		MaxAttempts: r.cfg.MaxAttempts, Backoff: r.cfg.Backoff, Now: o.now, Logger: o.logger,
		Attrs: func(e *engine.Event, err error) []any { return eventAttrs(Event(*e), err) },
	}
	if err := r.check(cfg); err != nil {
		return nil, err
	}
	r.life.init(o.mode, cfg.Name, o.now)
	sqlDB, err := rawDB(db)
	if err != nil {
		return nil, err
	}
	r.site = o.siteOf(sqlDB)
	r.table = &engine.Table{
		Store: o.store, DB: sqlDB, Now: o.now, Lease: r.cfg.Lease,
		StatementTimeout: r.cfg.StatementTimeout, Ordered: r.cfg.OrderByAggregate,
		WalkEvery: engine.WalkEvery, HistoryFailed: o.historyFailed(),
	}
	if h, ok := o.store.(store.History); ok && !o.noHistory {
		r.table.History = h
	}
	if o.wal != nil {
		if r.stream, err = logical.stream(r, sqlDB); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// Limits of RelayConfig: beyond them a relay cannot work as documented.
const (
	maxBatchSize        = 10000       // one claim's IN list and RETURNING stay modest
	maxWorkers          = 1000        // goroutines per batch
	minLease            = time.Second // the delivery budget and statements need room inside it
	minStatementTimeout = 10 * time.Millisecond
	minPollInterval     = time.Millisecond // a tighter poll is a busy loop on the database
)

// check validates the configuration as given (zero means default) and the
// relay's database.
func (r *Relay) check(c RelayConfig) error {
	var bad []string
	for _, f := range []struct {
		wrong bool
		what  string
	}{
		{c.BatchSize < 0 || c.BatchSize > maxBatchSize, fmt.Sprintf("BatchSize %d is outside 1-%d", c.BatchSize, maxBatchSize)},
		{c.Workers < 0 || c.Workers > maxWorkers, fmt.Sprintf("Workers %d is outside 1-%d", c.Workers, maxWorkers)},
		{c.PollInterval < 0 || (c.PollInterval > 0 && c.PollInterval < minPollInterval), fmt.Sprintf("PollInterval %v is below %v", c.PollInterval, minPollInterval)},
		{c.MaxAttempts < 0, fmt.Sprintf("MaxAttempts %d is negative", c.MaxAttempts)},
		{c.Lease < 0 || (c.Lease > 0 && c.Lease < minLease), fmt.Sprintf("Lease %v is below %v", c.Lease, minLease)},
		{c.HandlerTimeout < 0, fmt.Sprintf("HandlerTimeout %v is negative", c.HandlerTimeout)},
		{c.HandlerTimeout > r.cfg.Lease, fmt.Sprintf("HandlerTimeout %v exceeds Lease %v (a handler must end before the claim does)", c.HandlerTimeout, r.cfg.Lease)},
		{c.StatementTimeout < 0 || (c.StatementTimeout > 0 && c.StatementTimeout < minStatementTimeout), fmt.Sprintf("StatementTimeout %v is below %v", c.StatementTimeout, minStatementTimeout)},
		{c.WaitReplicas < 0, fmt.Sprintf("WaitReplicas %d is negative", c.WaitReplicas)},
	} {
		if f.wrong {
			bad = append(bad, f.what)
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("%w: RelayConfig: %s (0 means the default)", ErrInvalidConfig, strings.Join(bad, "; "))
	}
	switch {
	case r.db == nil:
		return fmt.Errorf("%w: Relay needs a *gorm.DB", ErrInvalidConfig)
	case r.o.noTable != nil:
		return r.o.noTable
	case fromDB(r.db) != r.o:
		return fmt.Errorf("%w: the *gorm.DB given to Relay does not have this Outbox installed", ErrNotInstalled)
	case c.WaitReplicas > 0 && r.o.replicas() == nil:
		return fmt.Errorf("%w: RelayConfig.WaitReplicas needs PostgreSQL (its streaming standbys); this outbox is on %s", ErrInvalidConfig, r.o.store.Name())
	}
	if _, inTx := txhook.Tracked(r.db.Statement.ConnPool); inTx {
		return fmt.Errorf("%w: Relay needs the *gorm.DB the plugin is installed on, not a transaction: it runs its own statements and transactions", ErrInvalidConfig)
	}
	return nil
}

// Run delivers events until ctx is cancelled. It claims a batch whenever one
// is due and waits when there is none, until PollInterval passes or a
// committed event wakes it: from a writer in the same process, or on
// PostgreSQL through LISTEN/NOTIFY. While the database is unreachable it
// backs off, logging once per outage rather than per attempt; while a
// handler reports its destination down ([Unavailable]) it pauses and
// probes, counting no attempts and logging once per episode. It also
// deletes sent rows older than Config.RetainSent.
//
// When ctx is cancelled, Run stops claiming, lets deliveries in progress
// finish (they are bounded by their lease deadline), hands the batch's
// undelivered events back for other relays, records the outcomes and
// returns nil: a configuration error is [Outbox.Relay]'s, which then returns
// no relay.
func (r *Relay) Run(ctx context.Context) error {
	w := r.site.wakers.add()
	defer r.site.wakers.remove(w)

	var bg sync.WaitGroup
	defer bg.Wait()
	bgCtx, stopBG := context.WithCancel(ctx)
	defer stopBG()
	if n, ok := r.o.store.(store.Notifier); ok && r.o.notify {
		bg.Add(1)
		go func() { defer bg.Done(); r.listen(bgCtx, n, w) }()
	}
	bg.Add(1)
	go func() { defer bg.Done(); maint.Run(bgCtx, r.o.logger, r.services()...) }()
	if r.stream != nil {
		// The stream delivers new events; the loop below retries those
		// the stream wrote to the table.
		bg.Add(1)
		go func() { defer bg.Done(); r.stream.Run(bgCtx) }()
	}

	loop := &engine.Loop{
		Process: r.process, BatchSize: r.cfg.BatchSize, PollInterval: r.cfg.PollInterval,
		MaxBatch: r.maxBatch, Quick: min(engine.Budget(r.cfg.Lease)/8, growQuick),
		Wake: w.wake, Fresh: r.site.fresh, Logger: r.o.logger,
		// The database may be another server now (a promoted standby),
		// whose seqs need not follow those seen before.
		Recovered: r.table.Resweep,
	}
	if r.gate == nil {
		// A RelayGroup's turns cover a claim and its delivery together.
		loop.Claim = func(ctx context.Context, limit int) (engine.Batch, error) {
			b, err := r.lease(ctx, nil, limit)
			if b == nil { // not a nil *TableBatch in a Batch
				return nil, err
			}
			return b, nil
		}
		loop.Deliver = func(ctx context.Context, b engine.Batch) (int, error) {
			return r.deliver(ctx, b.(*engine.TableBatch))
		}
	}
	loop.Run(ctx)
	return nil
}
