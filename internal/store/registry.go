package store

import (
	"cmp"
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/gorm-outbox/outbox/internal/errs"
)

// A Driver opens the store of one database.
type Driver struct {
	// Name is the store's name, unique among the registered drivers:
	// SchemaSQL, InboxSchemaSQL and UpgradeSQL take it.
	Name string
	// Priority orders the probes: the driver with the highest is asked
	// first, so that a store for a more specific server (CockroachDB over
	// the PostgreSQL one, MySQL as against MariaDB) wins over the general
	// one however the packages are initialised. Ties go by name.
	Priority int
	// Probe reports whether the store serves the database GORM names
	// dialector; db, when not nil, may be asked.
	Probe func(ctx context.Context, dialector string, db *sql.DB) bool
	// Open returns the store of the outbox table named table.
	Open func(table string) Store
}

var registry struct {
	mu      sync.Mutex
	drivers []Driver
}

// Register adds a store. A name registered twice panics: two packages
// claim one store.
func Register(d Driver) {
	registry.mu.Lock()
	defer registry.mu.Unlock()
	for _, r := range registry.drivers {
		if r.Name == d.Name {
			panic(fmt.Sprintf("outbox: store %q registered twice", d.Name))
		}
	}
	registry.drivers = append(registry.drivers, d)
	slices.SortStableFunc(registry.drivers, func(a, b Driver) int {
		return cmp.Or(cmp.Compare(b.Priority, a.Priority), cmp.Compare(a.Name, b.Name))
	})
}

func drivers() []Driver {
	registry.mu.Lock()
	defer registry.mu.Unlock()
	return slices.Clone(registry.drivers)
}

// Names returns the registered stores' names, sorted.
func Names() []string {
	var names []string
	for _, d := range drivers() {
		names = append(names, d.Name)
	}
	slices.Sort(names)
	return names
}

// Open returns the store of the driver, highest priority first, whose probe
// accepts the database, or an error wrapping errs.ErrUnsupportedDialect.
func Open(ctx context.Context, dialector string, db *sql.DB, table string) (Store, error) {
	for _, d := range drivers() {
		if d.Probe(ctx, dialector, db) {
			return d.Open(table), nil
		}
	}
	return nil, fmt.Errorf("%w: %q (supported: %s)", errs.ErrUnsupportedDialect, dialector, strings.Join(Names(), ", "))
}

// ByName returns the store registered under name, without asking a
// database: the schema's text for teams that run their own migrations.
func ByName(name, table string) (Store, error) {
	for _, d := range drivers() {
		if d.Name == name {
			return d.Open(table), nil
		}
	}
	return nil, fmt.Errorf("%w: %q (supported: %s)", errs.ErrUnsupportedDialect, name, strings.Join(Names(), ", "))
}
