package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/gorm-outbox/outbox"
	"gorm.io/gorm"
)

// BenchOrder is the business row every write-overhead transaction inserts.
type BenchOrder struct {
	ID       uint `gorm:"primaryKey"`
	Customer string
	Total    int
}

// TableName keeps the table name fixed whatever GORM's naming strategy.
func (BenchOrder) TableName() string { return "bench_orders" }

// orderCreated is the payload every contender publishes, JSON-encoded.
type orderCreated struct {
	OrderID uint `json:"order_id"`
	Total   int  `json:"total"`
}

// writeContender is one way to write a business row (plus, except for the
// baseline, one message) in a transaction.
type writeContender struct {
	name  string
	db    *gorm.DB
	extra func(tx *gorm.DB, o *BenchOrder) error // nil: the business insert alone
}

const (
	wmWriteTopic = "orders"
	wmName       = "+ watermill-sql Publisher in the tx"
)

func runWrite(ctx context.Context, e *env, opts options, t *table) error {
	for _, d := range e.databases() {
		if err := writeOn(ctx, d, opts, t); err != nil {
			return fmt.Errorf("%s: %w", d.name(), err)
		}
	}
	return nil
}

func writeOn(ctx context.Context, d database, opts options, t *table) error {
	// The baseline, watermill-sql and the floor run on a plain *gorm.DB;
	// ours on one with the plugin installed, so its connection-pool hook is
	// part of what it costs.
	plain, err := d.open()
	if err != nil {
		return err
	}
	defer closeDB(plain)
	if err := plain.WithContext(ctx).AutoMigrate(&BenchOrder{}); err != nil {
		return fmt.Errorf("migrate business table: %w", err)
	}
	if err := createOutboxTable(ctx, plain, "floor_events"); err != nil {
		return err
	}
	withPlugin := func(cfg outbox.Config) (*gorm.DB, error) {
		db, err := d.open()
		if err != nil {
			return nil, err
		}
		cfg.Logger = warnLogger
		if err := db.Use(outbox.Plugin(cfg)); err != nil {
			closeDB(db)
			return nil, fmt.Errorf("install outbox: %w", err)
		}
		return db, nil
	}
	ours, err := withPlugin(outbox.Config{})
	if err != nil {
		return err
	}
	defer closeDB(ours)

	contenders := []writeContender{
		{name: "business insert alone", db: plain},
		{name: "+ outbox.Publish (ours)", db: ours, extra: publishOurs},
		{name: "+ hand-written INSERT (floor)", db: plain, extra: floorInsert(d)},
	}
	tables := []string{"bench_orders", outbox.DefaultTable, "floor_events"}
	if _, ok := d.(*mysqlServer); !ok {
		// The failed index the overview counts through (PostgreSQL and
		// SQLite; MySQL's pending index serves it): ours beside ours
		// without it is what the index costs the write path.
		const bare = "outbox_nofailidx"
		noIdx, err := withPlugin(outbox.Config{Table: bare})
		if err != nil {
			return err
		}
		defer closeDB(noIdx)
		if err := noIdx.WithContext(ctx).Exec(`DROP INDEX "` + bare + `_failed_idx"`).Error; err != nil {
			return fmt.Errorf("drop the failed index: %w", err)
		}
		contenders = append(contenders, writeContender{name: "+ outbox.Publish, no failed index (ours)", db: noIdx, extra: publishOurs})
		tables = append(tables, bare)
	}
	if _, ok := d.(*pgServer); ok && opts.floors {
		more, names, err := leanerFloors(ctx, plain, d)
		if err != nil {
			return err
		}
		contenders = append(contenders, more...)
		tables = append(tables, names...)
	}
	if _, ok := d.(*pgServer); ok {
		quiet, err := withPlugin(outbox.Config{DisableNotify: true})
		if err != nil {
			return err
		}
		defer closeDB(quiet)
		if err := wmCreateTables(ctx, sqlDB(plain), wmWriteTopic); err != nil {
			return err
		}
		contenders = append(contenders,
			writeContender{name: "+ outbox.Publish, DisableNotify (ours)", db: quiet, extra: publishOurs},
			writeContender{name: wmName, db: plain, extra: publishWatermill},
		)
		tables = append(tables, "watermill_"+wmWriteTopic)
	}

	for _, writers := range opts.writers {
		rates, ratios, cpu, err := writeRounds(ctx, contenders, writers, opts, "write "+d.name(),
			func(ctx context.Context) error { return d.clear(ctx, sqlDB(plain), tables...) })
		if err != nil {
			return err
		}
		scen := fmt.Sprintf("1 write overhead, %s, %d writer(s)", d.name(), writers)
		var oursRow *row
		for i, c := range contenders {
			if i == 0 {
				t.add(&row{scenario: scen, contender: c.name, metric: "tx/s", vals: rates[c.name], format: fmtRate})
				continue
			}
			r := t.add(&row{scenario: scen, contender: c.name, metric: "ratio to alone", vals: ratios[c.name], format: fmtRatio,
				note: "≈ " + fmtRate(rates[c.name].median())})
			if c.name == contenders[1].name {
				oursRow = r
			}
		}
		addCPURows(t, scen, contenders, cpu)
		// Judged on per-round quotients, which the slicing keeps under
		// the same load.
		quot := func(a, b string) float64 {
			var q series
			for i, v := range rates[a] {
				q = append(q, v/rates[b][i])
			}
			return q.median()
		}
		q := quot(contenders[1].name, contenders[2].name)
		// Issue 26's targets: within 5% of the hand-written INSERT of
		// the same row, and at or above watermill-sql.
		oursRow.judge(fmt.Sprintf("within 5%% of the floor: ours/floor ≥ 0.95, got %.2f", q), q >= 0.95)
		if _, ok := rates[wmName]; ok {
			q := quot(contenders[1].name, wmName)
			oursRow.judge(fmt.Sprintf("at or above watermill-sql: ours/watermill ≥ 1, got %.2f", q), q >= 1)
		}
	}
	return nil
}

// writeRounds measures the contenders with writers goroutines over
// opts.rounds rounds, prepare running before each, and returns each
// contender's tx/s and its ratio to the first contender, by round, and
// (on Linux) the CPU each spent per transaction: the machine's and, within
// it, the bench process's own (the Go side), in µs, by round.
func writeRounds(ctx context.Context, contenders []writeContender, writers int, opts options, label string, prepare func(context.Context) error) (rates, ratios map[string]series, cpu map[string]cpuSeries, err error) {
	rates, ratios, cpu = map[string]series{}, map[string]series{}, map[string]cpuSeries{}
	for round := range opts.rounds {
		if err := prepare(ctx); err != nil {
			return nil, nil, nil, err
		}
		// A short unmeasured warm-up fills the pools and caches.
		for _, c := range contenders {
			if _, _, err := measureWrites(ctx, c.db, writers, opts.writeDur/20, c.extra); err != nil {
				return nil, nil, nil, fmt.Errorf("%s: %w", c.name, err)
			}
		}
		// Each contender's time in a round is cut into slices taken in
		// turn, so a change in the machine's load (other processes, the
		// disk's flush time) lands on all of them alike rather than on
		// whichever ran during it.
		count := map[string]int64{}
		spent := map[string]time.Duration{}
		used := map[string]cpuTimes{}
		for slice := range writeSlices {
			for _, c := range rotate(contenders, round+slice) {
				before := readCPU()
				n, d, err := measureWrites(ctx, c.db, writers, opts.writeDur/writeSlices, c.extra)
				if err != nil {
					return nil, nil, nil, fmt.Errorf("%s: %w", c.name, err)
				}
				u := readCPU().sub(before)
				if slice == 0 {
					used[c.name] = u
				} else {
					used[c.name] = used[c.name].add(u)
				}
				count[c.name] += n
				spent[c.name] += d
			}
		}
		base := float64(count[contenders[0].name]) / spent[contenders[0].name].Seconds()
		for _, c := range contenders {
			r := float64(count[c.name]) / spent[c.name].Seconds()
			progress("%s %d writer(s) round %d: %-40s %8.0f tx/s", label, writers, round+1, c.name, r)
			rates[c.name] = append(rates[c.name], r)
			ratios[c.name] = append(ratios[c.name], r/base)
			if u := used[c.name]; u.ok && count[c.name] > 0 {
				perTx := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(count[c.name]) }
				cs := cpu[c.name]
				cs.machine = append(cs.machine, perTx(u.machine))
				cs.self = append(cs.self, perTx(u.self))
				cpu[c.name] = cs
			}
		}
	}
	return rates, ratios, cpu, nil
}

// cpuSeries is one contender's CPU per transaction, in µs, by round.
type cpuSeries struct{ machine, self series }

// writeSlices is how many turns each contender gets in a round.
const writeSlices = 10

// measureWrites runs business transactions on writers goroutines for dur
// and returns how many committed and how long that took.
func measureWrites(ctx context.Context, db *gorm.DB, writers int, dur time.Duration, extra func(*gorm.DB, *BenchOrder) error) (int64, time.Duration, error) {
	var (
		n        atomic.Int64
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
	)
	start := time.Now()
	deadline := start.Add(dur)
	for range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) && ctx.Err() == nil {
				err := db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
					o := BenchOrder{Customer: "customer-42", Total: 42}
					if err := tx.Create(&o).Error; err != nil {
						return fmt.Errorf("insert order: %w", err)
					}
					if extra != nil {
						return extra(tx, &o)
					}
					return nil
				})
				if err != nil {
					mu.Lock()
					firstErr = errors.Join(firstErr, err)
					mu.Unlock()
					return
				}
				n.Add(1)
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return 0, 0, firstErr
	}
	if err := ctx.Err(); err != nil {
		return 0, 0, err
	}
	return n.Load(), time.Since(start), nil
}

func publishOurs(tx *gorm.DB, o *BenchOrder) error {
	return outbox.Publish(tx, outbox.Event{
		Type:          "order.created",
		AggregateType: "order",
		AggregateID:   strconv.FormatUint(uint64(o.ID), 10),
		Payload:       orderCreated{OrderID: o.ID, Total: o.Total},
	})
}

// publishWatermill publishes through watermill-sql in the business
// transaction, as its docs describe for transactional publishing: a
// Publisher built on the transaction itself (without AutoInitializeSchema,
// which it forbids on a transaction).
func publishWatermill(tx *gorm.DB, o *BenchOrder) error {
	return watermillPublish(tx, o, wmWriteTopic, watermill.NewUUID())
}

// watermillPublish is publishWatermill's message with the given UUID on topic.
func watermillPublish(tx *gorm.DB, o *BenchOrder, topic, uuid string) error {
	pub, err := wmsql.NewPublisher(wmExecutor{tx.Statement.ConnPool},
		wmsql.PublisherConfig{SchemaAdapter: wmsql.DefaultPostgreSQLSchema{}}, nil)
	if err != nil {
		return fmt.Errorf("watermill publisher: %w", err)
	}
	payload, err := json.Marshal(orderCreated{OrderID: o.ID, Total: o.Total})
	if err != nil {
		return fmt.Errorf("encode payload: %w", err)
	}
	msg := message.NewMessage(uuid, payload)
	msg.SetContext(tx.Statement.Context)
	if err := pub.Publish(topic, msg); err != nil {
		return fmt.Errorf("watermill publish: %w", err)
	}
	return nil
}

// floorInsert is the hand-written outbox: one plain INSERT of the row ours
// writes for a generated event (the same columns, the same NULLs) into a
// table with the same DDL as ours, and nothing else (no validation, no ON
// CONFLICT, no RETURNING, no after-commit hook).
func floorInsert(d database) func(*gorm.DB, *BenchOrder) error {
	insert := floorInsertInto("floor_events", d)
	return func(tx *gorm.DB, o *BenchOrder) error {
		return insert(tx, strconv.FormatUint(uint64(o.ID), 10), o)
	}
}

// leanerFloors are the floor's INSERT into tables with the library's
// columns and fewer of its indexes (-floors): what the indexes a
// generated event does not enter still cost its INSERT. PostgreSQL opens
// every index of the table and tests every partial index's predicate on
// each INSERT, whether the row enters the index or not.
func leanerFloors(ctx context.Context, db *gorm.DB, d database) ([]writeContender, []string, error) {
	variants := []struct {
		name, table string
		drop        []string // the indexes of the library's DDL it drops
	}{
		{"+ floor, primary key + unique partial indexes", "floor_unique", []string{"retry", "sent", "failed"}},
		{"+ floor, primary key alone", "floor_pk", []string{"retry", "sent", "failed", "named_id", "idempotency_key"}},
	}
	var (
		cs     []writeContender
		tables []string
	)
	for _, v := range variants {
		if err := createOutboxTable(ctx, db, v.table); err != nil {
			return nil, nil, err
		}
		for _, idx := range v.drop {
			if err := db.WithContext(ctx).Exec(`DROP INDEX "` + v.table + "_" + idx + `_idx"`).Error; err != nil {
				return nil, nil, fmt.Errorf("%s: drop the %s index: %w", v.table, idx, err)
			}
		}
		insert := floorInsertInto(v.table, d)
		cs = append(cs, writeContender{name: v.name, db: db, extra: func(tx *gorm.DB, o *BenchOrder) error {
			return insert(tx, strconv.FormatUint(uint64(o.ID), 10), o)
		}})
		tables = append(tables, v.table)
	}
	return cs, tables, nil
}

// floorInsertInto returns the floor's INSERT into table, with aggID as the
// aggregate ID.
func floorInsertInto(table string, d database) func(tx *gorm.DB, aggID string, o *BenchOrder) error {
	q, times := d.floorInsert(table)
	return func(tx *gorm.DB, aggID string, o *BenchOrder) error {
		id, err := uuid.NewV7()
		if err != nil {
			return fmt.Errorf("event id: %w", err)
		}
		payload, err := json.Marshal(orderCreated{OrderID: o.ID, Total: o.Total})
		if err != nil {
			return fmt.Errorf("encode payload: %w", err)
		}
		// The library's clock: UTC, to the microsecond.
		now := d.timeArg(time.Now().UTC().Truncate(time.Microsecond))
		args := []any{d.idArg(id), "order.created", "order", aggID, string(payload)}
		for range times {
			args = append(args, now)
		}
		if _, err := tx.Statement.ConnPool.ExecContext(tx.Statement.Context, q, args...); err != nil {
			return fmt.Errorf("floor insert: %w", err)
		}
		return nil
	}
}

// addCPURows adds, per contender, the CPU a transaction cost beyond the
// first contender's (the business transaction alone): the machine's (the
// database server's, the bench's, the kernel's) and the bench process's own
// (the Go side: the library, the driver, GORM), medians of the per-round
// differences. On a shared machine these move less than the throughputs.
func addCPURows(t *table, scen string, contenders []writeContender, cpu map[string]cpuSeries) {
	base, ok := cpu[contenders[0].name]
	if !ok {
		return
	}
	diff := func(a, b series) series {
		var d series
		for i := range min(len(a), len(b)) {
			d = append(d, a[i]-b[i])
		}
		return d
	}
	for _, c := range contenders[1:] {
		cs, ok := cpu[c.name]
		if !ok {
			continue
		}
		t.add(&row{scenario: scen, contender: c.name, metric: "CPU µs/tx beyond alone: machine", vals: diff(cs.machine, base.machine), format: fmtMicros,
			note: fmt.Sprintf("of which the bench process %s", fmtMicros(diff(cs.self, base.self).median()))})
	}
}

func fmtMicros(v float64) string { return fmt.Sprintf("%.0f µs", v) }
