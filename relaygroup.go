package outbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"gorm.io/gorm"
)

// RelayGroupConfig configures a [RelayGroup]. Its zero value is usable.
type RelayGroupConfig struct {
	// Relay is the configuration of every database's relay, as for
	// [Outbox.Relay]: BatchSize, Workers, PollInterval and the rest apply
	// to each database.
	Relay RelayConfig

	// MaxActive bounds how many databases' batches (a claim, the
	// deliveries, the outcomes) run at once across the group, so that the
	// group as a whole holds at most MaxActive connections for claiming
	// and MaxActive × Relay.Workers Handler deliveries in flight however
	// many databases it serves (with an AsyncHandler, MaxActive batches'
	// worth, as the adapter's own limit allows: MaxPending, MaxInFlight).
	// Databases take turns in the order they asked, one batch each: a
	// database with a large backlog goes to the back of the line after
	// every batch, so one with a few events waits for at most MaxActive-1
	// others' batches, not for the backlog. Defaults to 4.
	MaxActive int
}

const defaultMaxActive = 4

// RelayGroup delivers the events of many databases with one set of
// handlers, hooks and settings (one [Outbox] installed on each database,
// for example a database per tenant), sharing a bounded number of active
// batches fairly between them. Create it with [Outbox.RelayGroup], add
// databases with [RelayGroup.Add] (before or while it runs), and run it
// with [RelayGroup.Run]. It is safe for concurrent use.
//
// Each database keeps what is its own: its claims and outcomes in its own
// table through its own connection pool, its wake-ups (a commit in this
// process, and on PostgreSQL its own LISTEN connection, since NOTIFY is per
// database), its retention and its [Outbox.Stats] (read through its
// *gorm.DB). Each database runs a relay loop of its own (a few goroutines
// that mostly wait); what the group bounds is the work: the claims,
// deliveries and outcome writes in flight.
// In Logical mode each database streams its own slot, which the group does
// not throttle; the retries of its table do take turns.
type RelayGroup struct {
	o   *Outbox
	cfg RelayGroupConfig
	g   *gate

	mu      sync.Mutex
	members map[string]*member
	run     context.Context // while Run runs; nil otherwise
	wg      sync.WaitGroup  // the members' relays started by Run
}

type member struct {
	db     *gorm.DB
	relay  *Relay
	cancel context.CancelFunc // nil until started
	done   chan struct{}      // closed when its relay returned
}

// RelayGroup returns an empty group of relays for databases o is
// installed on. A negative MaxActive or an invalid Relay configuration is
// an error wrapping [ErrInvalidConfig]; a memory-mode Outbox, which keeps
// no table, is refused as [Outbox.Relay] refuses it, when a database is
// added.
func (o *Outbox) RelayGroup(cfg RelayGroupConfig) (*RelayGroup, error) {
	if cfg.MaxActive < 0 {
		return nil, fmt.Errorf("%w: RelayGroupConfig.MaxActive %d is negative; use 0 for the default (%d)", ErrInvalidConfig, cfg.MaxActive, defaultMaxActive)
	}
	cfg.MaxActive = cmp.Or(cfg.MaxActive, defaultMaxActive)
	return &RelayGroup{o: o, cfg: cfg, g: newGate(cfg.MaxActive), members: map[string]*member{}}, nil
}

// Add adds db, on which the group's Outbox must be installed, under name,
// which names it in [RelayGroup.Names] and [RelayGroup.Remove]. While Run
// runs its relay starts at once. A name
// already in the group, or a configuration [Outbox.Relay] refuses for db,
// is an error.
func (g *RelayGroup) Add(name string, db *gorm.DB) error {
	if name == "" {
		return fmt.Errorf("%w: RelayGroup.Add: empty name", ErrInvalidConfig)
	}
	r, err := g.o.Relay(db, g.cfg.Relay)
	if err != nil {
		return fmt.Errorf("outbox: RelayGroup.Add %q: %w", name, err)
	}
	r.gate = g.g
	g.mu.Lock()
	defer g.mu.Unlock()
	if _, ok := g.members[name]; ok {
		return fmt.Errorf("%w: RelayGroup.Add: %q is already in the group", ErrInvalidConfig, name)
	}
	m := &member{db: db, relay: r}
	g.members[name] = m
	if g.run != nil {
		g.start(m)
	}
	return nil
}

// Remove stops the relay of the database added under name and takes it out
// of the group, returning once its deliveries in progress have finished
// and their outcomes are recorded (as Run does at shutdown). It reports
// whether name was in the group.
func (g *RelayGroup) Remove(name string) bool {
	g.mu.Lock()
	m, ok := g.members[name]
	delete(g.members, name)
	g.mu.Unlock()
	if !ok {
		return false
	}
	if m.cancel != nil {
		m.cancel()
		<-m.done
	}
	return true
}

// Names returns the names of the databases in the group, sorted.
func (g *RelayGroup) Names() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	names := make([]string, 0, len(g.members))
	for n := range g.members {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// Run runs the relays of every database in the group, and of those added
// while it runs, until ctx ends; then each stops as [Relay.Run] does, and
// Run returns nil once all have. Running it twice at once is an error.
func (g *RelayGroup) Run(ctx context.Context) error {
	g.mu.Lock()
	if g.run != nil {
		g.mu.Unlock()
		return errors.New("outbox: RelayGroup.Run is already running")
	}
	g.run = ctx
	for _, m := range g.members {
		g.start(m)
	}
	g.mu.Unlock()

	<-ctx.Done()
	g.mu.Lock()
	g.run = nil
	g.mu.Unlock()
	g.wg.Wait()
	g.mu.Lock()
	for _, m := range g.members {
		m.cancel, m.done = nil, nil // Run may be called again
	}
	g.mu.Unlock()
	return nil
}

// start runs m's relay under Run's context. g.mu is held.
func (g *RelayGroup) start(m *member) {
	ctx, cancel := context.WithCancel(g.run)
	m.cancel, m.done = cancel, make(chan struct{})
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		defer close(m.done)
		defer cancel()
		_ = m.relay.Run(ctx) // its configuration was checked by Add
	}()
}

// gate hands out a bounded number of turns in the order they were asked
// for: a FIFO semaphore, so that a relay that asks again right after its
// batch queues behind those already waiting.
type gate struct {
	mu      sync.Mutex
	free    int
	waiting []chan struct{}
}

func newGate(n int) *gate { return &gate{free: n} }

// acquire waits for a turn, or returns ctx's error.
func (g *gate) acquire(ctx context.Context) error {
	g.mu.Lock()
	if g.free > 0 && len(g.waiting) == 0 {
		g.free--
		g.mu.Unlock()
		return nil
	}
	turn := make(chan struct{})
	g.waiting = append(g.waiting, turn)
	g.mu.Unlock()
	select {
	case <-turn:
		return nil
	case <-ctx.Done():
		g.mu.Lock()
		if i := slices.Index(g.waiting, turn); i >= 0 {
			g.waiting = slices.Delete(g.waiting, i, i+1)
			g.mu.Unlock()
			return ctx.Err()
		}
		g.mu.Unlock()
		g.release() // granted meanwhile: pass it on
		return ctx.Err()
	}
}

// release ends a turn, handing it to the longest waiting.
func (g *gate) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.waiting) > 0 {
		close(g.waiting[0])
		g.waiting = g.waiting[1:]
		return
	}
	g.free++
}
