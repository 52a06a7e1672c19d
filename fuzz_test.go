package outbox_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	mysqldriver "github.com/go-sql-driver/mysql"
	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/outboxtest"
	"github.com/stretchr/testify/require"
	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// The fuzz targets check the public contract of Publish and of Config.Table
// against SQLite (always), PostgreSQL (when OUTBOX_TEST_POSTGRES_DSN is set)
// and MySQL/MariaDB (when OUTBOX_TEST_MYSQL_DSN is set): the same inputs on
// every database, so handlers are shown to receive equal JSON on all of them. Plain `go test` runs their seeds (f.Add and testdata/fuzz); fuzz
// with, for example:
//
//	go test -run='^$' -fuzz='^FuzzPublish$' -fuzztime=60s .
//	go test -run='^$' -fuzz='^FuzzTableName$' -fuzztime=60s .
//
// The oracle is an independent statement of the documented rules. Whether
// PostgreSQL's jsonb can store a payload (numbers beyond numeric's range)
// is asked of PostgreSQL itself when it is available; without it, only
// payloads whose numbers are moderate must be accepted.

type fuzzOrder struct {
	ID   uint `gorm:"primaryKey"`
	Note string
}

// fuzzDB is one database a fuzz target writes to, opened once per process
// (each fuzzing worker is a process of its own).
type fuzzDB struct {
	name  string
	sqlDB *gorm.DB // shares its pool with the per-iteration *gorm.DB of FuzzTableName
	open  func(t testing.TB) *gorm.DB
}

func fuzzDatabases(f *testing.F) []*fuzzDB {
	var out []*fuzzDB
	path := filepath.Join(f.TempDir(), "fuzz.db")
	sq, err := gorm.Open(sqlite.Open("file:"+path+outbox.SQLiteDSNOptions+"&_synchronous=OFF"),
		&gorm.Config{Logger: logger.Discard})
	require.NoError(f, err)
	f.Cleanup(func() { closeGorm(sq) })
	out = append(out, &fuzzDB{name: "sqlite", sqlDB: sq, open: func(t testing.TB) *gorm.DB {
		conn, err := sq.DB()
		require.NoError(t, err)
		db, err := gorm.Open(sqlite.Dialector{Conn: conn}, &gorm.Config{Logger: logger.Discard})
		require.NoError(t, err)
		return db
	}})

	if my := mysqlFuzzDB(f); my != nil {
		out = append(out, my)
	}
	dsn := os.Getenv("OUTBOX_TEST_POSTGRES_DSN")
	if dsn == "" {
		return out
	}
	admin, err := gorm.Open(postgres.Open(dsn), &gorm.Config{Logger: logger.Discard})
	require.NoError(f, err, "OUTBOX_TEST_POSTGRES_DSN is set but PostgreSQL is unreachable")
	f.Cleanup(func() { closeGorm(admin) })
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	schema := "fuzz_" + hex.EncodeToString(b)
	require.NoError(f, admin.Exec("CREATE SCHEMA "+schema).Error)
	f.Cleanup(func() { _ = admin.Exec("DROP SCHEMA " + schema + " CASCADE").Error })
	u, err := url.Parse(dsn)
	require.NoError(f, err)
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	pg, err := gorm.Open(postgres.Open(u.String()), &gorm.Config{Logger: logger.Discard})
	require.NoError(f, err)
	f.Cleanup(func() { closeGorm(pg) })
	out = append(out, &fuzzDB{name: "postgres", sqlDB: pg, open: func(t testing.TB) *gorm.DB {
		conn, err := pg.DB()
		require.NoError(t, err)
		db, err := gorm.Open(postgres.New(postgres.Config{Conn: conn}), &gorm.Config{Logger: logger.Discard})
		require.NoError(t, err)
		return db
	}})
	return out
}

// mysqlFuzzDB is a database of its own on the server OUTBOX_TEST_MYSQL_DSN
// names, or nil when that is unset.
func mysqlFuzzDB(f *testing.F) *fuzzDB {
	dsn := os.Getenv("OUTBOX_TEST_MYSQL_DSN")
	if dsn == "" {
		return nil
	}
	admin, err := gorm.Open(mysql.Open(dsn), &gorm.Config{Logger: logger.Discard})
	require.NoError(f, err, "OUTBOX_TEST_MYSQL_DSN is set but MySQL is unreachable")
	f.Cleanup(func() { closeGorm(admin) })
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := "fuzz_" + hex.EncodeToString(b)
	require.NoError(f, admin.Exec("CREATE DATABASE "+name).Error)
	f.Cleanup(func() { _ = admin.Exec("DROP DATABASE " + name).Error })
	cfg, err := mysqldriver.ParseDSN(dsn)
	require.NoError(f, err)
	cfg.DBName = name
	my, err := gorm.Open(mysql.Open(cfg.FormatDSN()), &gorm.Config{Logger: logger.Discard})
	require.NoError(f, err)
	f.Cleanup(func() { closeGorm(my) })
	return &fuzzDB{name: "mysql", sqlDB: my, open: func(t testing.TB) *gorm.DB {
		conn, err := my.DB()
		require.NoError(t, err)
		db, err := gorm.Open(mysql.New(mysql.Config{Conn: conn}), &gorm.Config{Logger: logger.Discard})
		require.NoError(t, err)
		return db
	}}
}

func closeGorm(db *gorm.DB) {
	if sqlDB, err := db.DB(); err == nil {
		_ = sqlDB.Close()
	}
}

// publishEnv is a database with the plugin installed and a relay whose
// handler keeps what it receives.
type publishEnv struct {
	name  string
	db    *gorm.DB
	ob    *outbox.Outbox
	relay *outbox.Relay
	mu    sync.Mutex
	got   []outbox.Event
}

func newPublishEnv(t testing.TB, fdb *fuzzDB) *publishEnv {
	e := &publishEnv{name: fdb.name, db: fdb.open(t)}
	e.ob = outbox.Plugin(outbox.Config{Logger: slog.New(slog.DiscardHandler), DisableNotify: true, RetainSent: outbox.RetainForever})
	require.NoError(t, e.db.Use(e.ob))
	require.NoError(t, e.db.AutoMigrate(&fuzzOrder{}))
	e.ob.Handle(outbox.AnyEvent, func(_ context.Context, ev outbox.Event) error {
		e.mu.Lock()
		e.got = append(e.got, ev)
		e.mu.Unlock()
		return nil
	})
	e.relay = outboxtest.Relay(t, e.ob, e.db, outbox.RelayConfig{})
	return e
}

// FuzzPublish publishes one fuzzed event (every string field, two headers,
// the payload as raw bytes, []byte, a Go string or a decoded Go value, and
// OccurredAt) next to a valid one, in a transaction that also writes a
// business row. Either the event is accepted and comes back equal (read from
// the table, and delivered by the relay), or Publish returns an error
// wrapping ErrInvalidEvent having written nothing, the transaction still
// works, and rolling it back leaves no row. An independent statement of the
// documented rules decides which of the two must happen.
func FuzzPublish(f *testing.F) {
	for _, s := range publishSeeds() {
		f.Add(s.typ, s.id, s.aggType, s.aggID, s.key, s.hk1, s.hv1, s.hk2, s.hv2, s.payload, s.kind, s.occurred)
	}
	var envs []*publishEnv
	for _, fdb := range fuzzDatabases(f) {
		envs = append(envs, newPublishEnv(f, fdb))
	}
	f.Fuzz(func(t *testing.T, typ, id, aggType, aggID, key, hk1, hv1, hk2, hv2 string, payload []byte, kind uint8, occurred int64) {
		in := newPublishInput(typ, id, aggType, aggID, key, hk1, hv1, hk2, hv2, payload, kind, occurred)
		in.storable = jsonbStorable(t, envs, in.wantJSON)
		for _, e := range envs {
			e.check(t, in)
		}
	})
}

type publishSeed struct {
	typ, id, aggType, aggID, key, hk1, hv1, hk2, hv2 string
	payload                                          []byte
	kind                                             uint8
	occurred                                         int64
}

func publishSeeds() []publishSeed {
	return []publishSeed{
		{typ: "order.created", payload: []byte(`{"id":1,"items":["a","b"]}`)},
		{typ: "order.created", id: "o-1", aggType: "order", aggID: "1", key: "order:1", hk1: "traceparent", hv1: "00-abc-01",
			payload: []byte(`{"total":12.50,"currency":"EUR","lines":[{"sku":"x","qty":2}],"paid":true,"note":null}`), occurred: 1767225600123},
		{typ: "", payload: []byte(`{}`)},
		{typ: "x", payload: []byte(`{"a":`)},
		{typ: "x", payload: []byte(`{"secret":"fuzzmarker",`)},
		{typ: "x", payload: []byte(`{"secret":"fuzzmarker\ud800"}`)},
		{typ: "x", payload: []byte("\"\xff\"")},
		{typ: "x", payload: []byte(`{"a":"\u0000"}`)},
		{typ: "x", payload: []byte(`"\\u0000"`)},
		{typ: "x", payload: []byte("\"caf\xc3\xa9 \\u00e9 \\ud83d\\ude00\"")},
		{typ: "x", payload: []byte(`[1, -0, 0.5e-3, 1E+2, 123456789012345678901234567890]`)},
		{typ: "x", payload: []byte(`{"a":1,"a":2}`)},
		{typ: "x", payload: []byte(" \t\n[]\n"), kind: 1},
		{typ: "x", payload: []byte("a\x00b"), kind: 2},
		{typ: "x", payload: []byte("\xff\xfe plain string"), kind: 2},
		{typ: "x", payload: []byte(`{"nested":{"deep":[[[{"k":"v"}]]]}}`), kind: 3},
		{typ: "x", payload: []byte(strings.Repeat(`{"a":[`, 15) + `{}` + strings.Repeat(`]}`, 15)), kind: 1}, // 31 levels
		{typ: "x", payload: []byte(strings.Repeat(`{"a":[`, 16) + strings.Repeat(`]}`, 16)), kind: 1},        // 32 levels
		{typ: "x", payload: nil, kind: 0},
		{typ: "x", payload: []byte{}, kind: 1},
		{typ: "x", hk1: "", hv1: "v"},
		{typ: "x", hk1: "k", hv1: "\xff"},
		{typ: "x", hk1: "k\x00", hv1: "v"},
		{typ: "x", hk1: "a", hv1: "1", hk2: "b", hv2: "<&>\u2028"},
		{typ: strings.Repeat("t", 255), id: strings.Repeat("i", 255), aggType: strings.Repeat("é", 127), key: strings.Repeat("k", 255)},
		{typ: strings.Repeat("t", 256)},
		{typ: "\xff"},
		{typ: "x", id: "a\x00"},
		{typ: `'; DROP TABLE outbox_events; --`, id: `" OR 1=1 --`, aggID: `$1 ?1`, key: `\'`},
		{typ: "x", id: "same", key: "same"},
		{typ: "x", id: canaryID},
		{typ: "x", key: canaryID},
		{typ: "x", occurred: -62135596800000}, // 0001-01-01
		{typ: "x", occurred: 253402300799999}, // 9999-12-31 23:59:59.999
	}
}

// publishInput is one fuzzed event and what must come back.
type publishInput struct {
	ev       outbox.Event
	kind     uint8
	raw      []byte // the payload bytes, for the raw kinds
	wantJSON []byte // the payload's JSON when accepted; nil if it cannot be encoded
	storable storability
}

// storability says whether PostgreSQL's jsonb can store the payload.
type storability int

const (
	storableUnknown storability = iota // no PostgreSQL to ask, and extreme numbers
	storableYes
	storableNo
)

// jsonbStorable asks PostgreSQL, when a leg runs on it, whether jsonb takes
// the payload; otherwise it decides what it can without it.
func jsonbStorable(t *testing.T, envs []*publishEnv, p []byte) storability {
	if p == nil || !json.Valid(p) || !utf8.Valid(p) {
		return storableNo
	}
	for _, e := range envs {
		if e.name != "postgres" {
			continue
		}
		var ok bool
		err := e.db.Raw("SELECT CAST(? AS jsonb) IS NOT NULL", string(p)).Row().Scan(&ok)
		if err == nil {
			return storableYes
		}
		if isDataException(err) {
			return storableNo
		}
		t.Fatalf("asking PostgreSQL about the payload: %v", err)
	}
	if jsonHasNUL(p) || hasUnpairedSurrogate(p) {
		return storableNo
	}
	if hasExtremeNumber(p) {
		return storableUnknown
	}
	return storableYes
}

func newPublishInput(typ, id, aggType, aggID, key, hk1, hv1, hk2, hv2 string, payload []byte, kind uint8, occurred int64) publishInput {
	in := publishInput{kind: kind % 4, raw: payload}
	ev := outbox.Event{Type: typ, ID: id, AggregateType: aggType, AggregateID: aggID, IdempotencyKey: key}
	for _, h := range [][2]string{{hk1, hv1}, {hk2, hv2}} {
		if h[0] != "" || h[1] != "" {
			if ev.Headers == nil {
				ev.Headers = map[string]string{}
			}
			ev.Headers[h[0]] = h[1]
		}
	}
	if occurred != 0 {
		// Milliseconds, with sub-microsecond noise that must be truncated.
		ev.OccurredAt = time.Unix(occurred/1000, (occurred%1000)*1_000_000+789)
	}
	switch in.kind {
	case 0:
		ev.Payload = json.RawMessage(payload)
		in.wantJSON = payload
		if payload == nil {
			in.wantJSON = []byte("null")
		}
	case 1:
		ev.Payload = payload
		in.wantJSON = payload
		if payload == nil {
			in.wantJSON = []byte("null")
		}
	case 2:
		ev.Payload = string(payload)
		in.wantJSON, _ = json.Marshal(string(payload))
	case 3:
		var v any
		if json.Unmarshal(payload, &v) == nil {
			ev.Payload = v
			in.wantJSON, _ = json.Marshal(v)
		} else {
			ev.Payload = payload
			in.kind = 1
			in.wantJSON = payload
		}
	}
	in.ev = ev
	return in
}

func (in publishInput) timeOutOfRange() bool {
	if in.ev.OccurredAt.IsZero() {
		return false
	}
	y := in.ev.OccurredAt.UTC().Year()
	return y < 1 || y > 9999
}

// invalidReason states the documented rules independently of the
// implementation: "" means the event must be accepted, "?" that either
// outcome is right (only without PostgreSQL to ask about extreme numbers).
func (in publishInput) invalidReason() string {
	e := in.ev
	if e.Type == "" {
		return "empty Type"
	}
	if in.timeOutOfRange() {
		return "OccurredAt outside years 1-9999"
	}
	for name, v := range map[string]string{"ID": e.ID, "Type": e.Type, "AggregateType": e.AggregateType,
		"AggregateID": e.AggregateID, "IdempotencyKey": e.IdempotencyKey} {
		if r := textProblem(v); r != "" {
			return name + ": " + r
		}
	}
	if len(e.Headers) > 0 {
		for k, v := range e.Headers {
			if k == "" {
				return "empty header name"
			}
			if r := textProblem(k); r != "" {
				return "header name: " + r
			}
			if !utf8.ValidString(v) || strings.IndexByte(v, 0) >= 0 {
				return "header value not UTF-8 or has NUL"
			}
		}
		if b, _ := json.Marshal(e.Headers); len(b) > 64<<10 {
			return "headers too large"
		}
	}
	p := in.wantJSON
	switch {
	case p == nil:
		return "payload cannot be encoded"
	case (in.kind == 0 || in.kind == 1) && in.raw != nil && !utf8.Valid(in.raw):
		return "payload bytes not UTF-8"
	case in.kind == 2 && !utf8.Valid(in.raw):
		// encoding/json would replace the bytes with U+FFFD: refused as
		// the same bytes are in a json.RawMessage.
		return "payload string not UTF-8"
	case !json.Valid(p):
		return "payload not JSON"
	case len(p) > 1<<20:
		return "payload over 1 MiB"
	case jsonHasNUL(p):
		return `payload contains \u0000`
	case jsonDepth(p) > 31:
		return "payload nests deeper than MariaDB's 31 levels"
	case in.storable == storableNo:
		return "PostgreSQL's jsonb cannot store the payload"
	case in.storable == storableUnknown:
		return "?"
	}
	return ""
}

// jsonDepth returns how deeply valid JSON p nests arrays and objects.
func jsonDepth(p []byte) int {
	dec := json.NewDecoder(bytes.NewReader(p))
	depth, deepest := 0, 0
	for {
		tok, err := dec.Token()
		if err != nil {
			return deepest
		}
		switch tok {
		case json.Delim('['), json.Delim('{'):
			depth++
			deepest = max(deepest, depth)
		case json.Delim(']'), json.Delim('}'):
			depth--
		}
	}
}

// hasUnpairedSurrogate reports whether valid JSON p spells a UTF-16
// surrogate escape that is not a high-low pair (Go decodes those to U+FFFD
// without complaint; jsonb refuses them).
func hasUnpairedSurrogate(p []byte) bool {
	s := string(p)
	inString := false
	for i := 0; i < len(s); i++ {
		switch {
		case s[i] == '"':
			inString = !inString
		case inString && s[i] == '\\':
			if i+1 < len(s) && s[i+1] == 'u' && i+6 <= len(s) {
				r, ok := parseHex(s[i+2 : i+6])
				switch {
				case ok && r >= 0xD800 && r < 0xDC00:
					lo, ok2 := rune(0), false
					if i+12 <= len(s) && s[i+6] == '\\' && s[i+7] == 'u' {
						lo, ok2 = parseHex(s[i+8 : i+12])
					}
					if !ok2 || lo < 0xDC00 || lo >= 0xE000 {
						return true
					}
					i += 11
					continue
				case ok && r >= 0xDC00 && r < 0xE000:
					return true
				}
			}
			i++ // the escaped character
		}
	}
	return false
}

func parseHex(h string) (rune, bool) {
	var r rune
	for _, c := range h {
		var v rune
		switch {
		case c >= '0' && c <= '9':
			v = c - '0'
		case c >= 'a' && c <= 'f':
			v = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			v = c - 'A' + 10
		default:
			return 0, false
		}
		r = r<<4 | v
	}
	return r, true
}

// hasExtremeNumber reports whether valid JSON p holds a number with more
// than 1000 digits or an exponent beyond +-1000: only such numbers can fall
// outside PostgreSQL numeric's range.
func hasExtremeNumber(p []byte) bool {
	dec := json.NewDecoder(bytes.NewReader(p))
	dec.UseNumber()
	for {
		tok, err := dec.Token()
		if err != nil {
			return false
		}
		n, ok := tok.(json.Number)
		if !ok {
			continue
		}
		m := numberRE.FindStringSubmatch(string(n))
		if m == nil || len(m[2])+len(m[3]) > 1000 || len(strings.TrimLeft(strings.TrimLeft(m[4], "+-"), "0")) > 3 {
			return true
		}
	}
}

func textProblem(v string) string {
	switch {
	case len(v) > 255:
		return "over 255 bytes"
	case !utf8.ValidString(v):
		return "not UTF-8"
	case strings.IndexByte(v, 0) >= 0:
		return "NUL byte"
	}
	return ""
}

// jsonHasNUL reports whether a string or key of valid JSON p holds U+0000
// (which JSON can only spell \u0000).
func jsonHasNUL(p []byte) bool {
	dec := json.NewDecoder(bytes.NewReader(p))
	dec.UseNumber()
	for {
		tok, err := dec.Token()
		if err != nil {
			return false
		}
		if s, ok := tok.(string); ok && strings.IndexByte(s, 0) >= 0 {
			return true
		}
	}
}

var errFuzzRollback = errors.New("fuzz: roll back")

const canaryID = "fuzz-canary"

func (e *publishEnv) check(t *testing.T, in publishInput) {
	ctx := context.Background()
	ev := in.ev
	// A valid event published in the same call: a rejected call must not
	// write it either. Left out when the fuzzed event would collide with it
	// (same ID or key: the later one is skipped by design).
	events := []outbox.Event{{ID: canaryID, Type: "canary", Payload: 1}}
	if ev.ID == canaryID || ev.IdempotencyKey == canaryID || (ev.IdempotencyKey == "" && ev.ID == canaryID) {
		events = nil
	}
	events = append(events, ev)
	defer e.reset(t)

	reason := in.invalidReason()
	var perr error
	txErr := e.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		require.NoError(t, tx.Create(&fuzzOrder{Note: "before"}).Error)
		perr = outbox.Publish(tx, events...)
		if perr == nil {
			return nil
		}
		if !errors.Is(perr, outbox.ErrInvalidEvent) {
			t.Fatalf("%s: BUG: Publish failed with an error that does not wrap ErrInvalidEvent (the INSERT reached the database and failed; on PostgreSQL this aborts the caller's transaction): %v",
				e.name, perr)
		}
		var n int64
		require.NoError(t, tx.Table(e.ob.Table()).Count(&n).Error)
		require.Zero(t, n, "%s: a rejected Publish wrote %d rows", e.name, n)
		require.NoError(t, tx.Create(&fuzzOrder{Note: "after"}).Error, "%s: the transaction is unusable after ErrInvalidEvent", e.name)
		require.NoError(t, outbox.Publish(tx, outbox.Event{Type: "after"}), "%s: the transaction is unusable after ErrInvalidEvent", e.name)
		return errFuzzRollback
	})

	if perr != nil {
		require.ErrorIs(t, txErr, errFuzzRollback)
		require.NotEmpty(t, reason, "%s: a valid event was rejected: %v", e.name, perr)
		if bytes.Contains(in.raw, []byte("fuzzmarker")) {
			require.NotContains(t, perr.Error(), "fuzzmarker", "%s: the error quotes the payload", e.name)
		}
		require.Zero(t, e.count(t, e.ob.Table()), "%s: rollback left outbox rows", e.name)
		require.Zero(t, e.count(t, "fuzz_orders"), "%s: rollback left business rows", e.name)
		return
	}
	require.NoError(t, txErr)
	if reason != "?" {
		require.Empty(t, reason, "%s: an invalid event was accepted", e.name)
	}
	require.EqualValues(t, len(events), e.count(t, e.ob.Table()), "%s: rows written", e.name)

	// Read it back from the table.
	var rec outbox.Row
	q := e.db.Table(e.ob.Table()).Where("COALESCE(named_id, '') <> ?", canaryID)
	if ev.ID != "" {
		q = e.db.Table(e.ob.Table()).Where("named_id = ?", ev.ID)
	}
	require.NoError(t, q.Take(&rec).Error)
	wantKey := ev.IdempotencyKey
	if wantKey == "" {
		wantKey = rec.ID
	}
	require.Equal(t, ev.Type, rec.EventType, e.name)
	require.Equal(t, ev.AggregateType, rec.AggregateType, e.name)
	require.Equal(t, ev.AggregateID, rec.AggregateID, e.name)
	require.Equal(t, wantKey, rec.IdempotencyKey, e.name)
	requireSameJSON(t, e.name+": stored payload", in.wantJSON, []byte(rec.Payload))
	if e.name == "sqlite" && in.kind <= 1 && in.raw != nil {
		require.Equal(t, string(in.raw), rec.Payload, "sqlite stores a raw payload as it is")
	}

	// Deliver it.
	n, err := e.relay.ProcessOnce(ctx)
	require.NoError(t, err, "%s: relay", e.name)
	require.Equal(t, len(events), n, "%s: claimed", e.name)
	e.mu.Lock()
	got := e.got
	e.mu.Unlock()
	require.Len(t, got, len(events), "%s: delivered", e.name)
	var d outbox.Event
	for _, g := range got {
		if g.ID == rec.ID {
			d = g
		}
	}
	require.Equal(t, rec.ID, d.ID, "%s: the fuzzed event was not delivered", e.name)
	require.Equal(t, ev.Type, d.Type, e.name)
	require.Equal(t, ev.AggregateType, d.AggregateType, e.name)
	require.Equal(t, ev.AggregateID, d.AggregateID, e.name)
	require.Equal(t, wantKey, d.IdempotencyKey, e.name)
	if len(ev.Headers) == 0 {
		require.Empty(t, d.Headers, e.name)
	} else {
		require.Equal(t, ev.Headers, d.Headers, e.name)
	}
	raw, ok := d.Payload.(json.RawMessage)
	require.True(t, ok, "%s: handlers receive json.RawMessage, got %T", e.name, d.Payload)
	requireSameJSON(t, e.name+": delivered payload", in.wantJSON, raw)
	if !ev.OccurredAt.IsZero() {
		want := ev.OccurredAt.UTC().Truncate(time.Microsecond)
		require.True(t, want.Equal(d.OccurredAt), "%s: OccurredAt %v came back as %v", e.name, want, d.OccurredAt)
		require.True(t, want.Equal(rec.OccurredAt), "%s: OccurredAt %v stored as %v", e.name, want, rec.OccurredAt)
	}
	require.EqualValues(t, len(events), e.countWhere(t, "status = ?", outbox.StatusSent), "%s: sent", e.name)
}

func (e *publishEnv) count(t *testing.T, table string) int64 {
	var n int64
	require.NoError(t, e.db.Table(table).Count(&n).Error)
	return n
}

func (e *publishEnv) countWhere(t *testing.T, where string, args ...any) int64 {
	var n int64
	require.NoError(t, e.db.Table(e.ob.Table()).Where(where, args...).Count(&n).Error)
	return n
}

func (e *publishEnv) reset(t *testing.T) {
	require.NoError(t, e.db.Exec("DELETE FROM "+e.ob.Table()).Error)
	require.NoError(t, e.db.Exec("DELETE FROM fuzz_orders").Error)
	e.mu.Lock()
	e.got = nil
	e.mu.Unlock()
}

// isDataException reports whether err is a PostgreSQL data exception
// (SQLSTATE class 22: invalid JSON, numeric or timestamp out of range).
func isDataException(err error) bool {
	var s interface{ SQLState() string }
	return errors.As(err, &s) && strings.HasPrefix(s.SQLState(), "22")
}

// requireSameJSON compares two JSON texts as values: PostgreSQL's jsonb
// reorders keys, drops duplicate keys (keeping the last, as Go does) and
// rewrites numbers, so numbers are compared exactly by value.
func requireSameJSON(t *testing.T, what string, want, got []byte) {
	t.Helper()
	w, err := decodeJSON(want)
	require.NoError(t, err, "%s: want", what)
	g, err := decodeJSON(got)
	require.NoError(t, err, "%s: got %.200q", what, got)
	if !reflect.DeepEqual(w, g) {
		t.Fatalf("%s differs:\nwant %.300q\ngot  %.300q", what, want, got)
	}
}

func decodeJSON(b []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	return canonJSON(v), nil
}

func canonJSON(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			x[k] = canonJSON(e)
		}
	case []any:
		for i, e := range x {
			x[i] = canonJSON(e)
		}
	case json.Number:
		return canonNumber(string(x))
	}
	return v
}

var numberRE = regexp.MustCompile(`^(-?)(\d+)(?:\.(\d+))?(?:[eE]([+-]?\d+))?$`)

// canonNumber writes a JSON number as sign, significant digits and
// exponent, exactly and cheaply even for huge exponents.
func canonNumber(s string) string {
	m := numberRE.FindStringSubmatch(s)
	if m == nil {
		return "invalid:" + s
	}
	digits := strings.TrimLeft(m[2]+m[3], "0")
	exp := new(big.Int)
	if m[4] != "" {
		exp.SetString(strings.TrimPrefix(m[4], "+"), 10)
	}
	exp.Sub(exp, big.NewInt(int64(len(m[3]))))
	trimmed := strings.TrimRight(digits, "0")
	exp.Add(exp, big.NewInt(int64(len(digits)-len(trimmed))))
	if trimmed == "" {
		return "0"
	}
	return m[1] + trimmed + "e" + exp.String()
}

// tableNameRule is the documented rule for Config.Table: ASCII letters,
// digits and underscores, not starting with a digit, at most 40 bytes,
// neither "sqlite" nor starting with "sqlite_".
var tableNameRule = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,39}$`)

func validTableName(s string) bool {
	return tableNameRule.MatchString(s) && !strings.HasPrefix(strings.ToLower(s)+"_", "sqlite_") &&
		!strings.EqualFold(s, outbox.DefaultInboxTable) // the inbox's, with InboxTable left at its default
}

// FuzzTableName installs the plugin with a fuzzed Config.Table. A name the
// documented rule accepts must create a table of exactly that name that
// events can be published into; any other name must fail db.Use with
// ErrInvalidConfig before touching the database. Either way no other table
// may appear or disappear.
func FuzzTableName(f *testing.F) {
	for _, s := range []string{
		"outbox_events", "custom_outbox", "_", "a", "A1_b2", "events_2026",
		"", `x"; DROP TABLE fuzz_sentinel; --`, "1abc", "a b", "a.b", "a-b", "é", "x\x00", "x;", "x'", "`x`", "[x]",
		strings.Repeat("a", 40), strings.Repeat("a", 41), strings.Repeat("a", 64),
		"order", "user", "select", "MyTable", "sqlite_x", "SQLITE_x", "outbox_inbox", "OUTBOX_INBOX",
	} {
		f.Add(s)
	}
	dbs := fuzzDatabases(f)
	for _, fdb := range dbs {
		require.NoError(f, fdb.sqlDB.Exec("CREATE TABLE fuzz_sentinel (id integer PRIMARY KEY)").Error)
		require.NoError(f, fdb.sqlDB.Exec("INSERT INTO fuzz_sentinel (id) VALUES (1)").Error)
	}
	f.Fuzz(func(t *testing.T, name string) {
		if strings.EqualFold(name, "fuzz_sentinel") {
			t.Skip("the fixture's own table")
		}
		for _, fdb := range dbs {
			checkTableName(t, fdb, name)
		}
	})
}

func checkTableName(t *testing.T, fdb *fuzzDB, name string) {
	want := name
	if want == "" {
		want = outbox.DefaultTable
	}
	valid := validTableName(want)
	db := fdb.open(t)
	err := db.Use(outbox.Plugin(outbox.Config{Table: name, Logger: slog.New(slog.DiscardHandler)}))
	if valid {
		defer dropTable(t, fdb, want)
		defer dropTable(t, fdb, outbox.DefaultInboxTable)
		defer dropTable(t, fdb, want+"_rollup")
		defer dropTable(t, fdb, want+"_rollup_state")
		defer dropTable(t, fdb, want+"_attempts")
		defer dropTable(t, fdb, want+"_relays")
	}
	switch {
	case !valid:
		require.ErrorIs(t, err, outbox.ErrInvalidConfig, "%s: %q", fdb.name, name)
	case err != nil:
		t.Fatalf("%s: BUG: db.Use refused the valid table name %q with an error that is not ErrInvalidConfig: %v", fdb.name, want, err)
	default:
		if n := tableCount(t, fdb, want); n != 1 {
			t.Fatalf("%s: BUG: no table named exactly %q after db.Use (found %d)", fdb.name, want, n)
		}
		require.NoError(t, outbox.PublishAlone(db, outbox.Event{Type: "t"}), "%s: publish into %q", fdb.name, want)
		var n int64
		require.NoError(t, db.Table(want).Count(&n).Error)
		require.EqualValues(t, 1, n)
	}
	tables := listTables(t, fdb)
	// sqlite_sequence: SQLite's own, for the AUTOINCREMENT seq.
	// The inbox table, the overview's rollup, the history and the relays:
	// db.Use creates them beside the outbox table, named after it.
	extra := slicesWithout(tables, "fuzz_sentinel", "sqlite_sequence", want, strings.ToLower(want), outbox.DefaultInboxTable,
		want+"_rollup", strings.ToLower(want)+"_rollup", want+"_rollup_state", strings.ToLower(want)+"_rollup_state",
		want+"_attempts", strings.ToLower(want)+"_attempts", want+"_relays", strings.ToLower(want)+"_relays")
	require.Empty(t, extra, "%s: unexpected tables after %q", fdb.name, name)
	var n int64
	require.NoError(t, fdb.sqlDB.Raw("SELECT count(*) FROM fuzz_sentinel").Scan(&n).Error, "%s: the sentinel table is gone after %q", fdb.name, name)
	require.EqualValues(t, 1, n)
}

func tableCount(t *testing.T, fdb *fuzzDB, name string) int64 {
	var n int64
	q := "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?"
	switch fdb.name {
	case "postgres":
		q = "SELECT count(*) FROM information_schema.tables WHERE table_schema = current_schema() AND table_name = ?"
	case "mysql":
		q = "SELECT count(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = CAST(? AS BINARY)"
	}
	require.NoError(t, fdb.sqlDB.Raw(q, name).Scan(&n).Error)
	return n
}

func listTables(t *testing.T, fdb *fuzzDB) []string {
	var names []string
	q := "SELECT name FROM sqlite_master WHERE type = 'table'"
	switch fdb.name {
	case "postgres":
		q = "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()"
	case "mysql":
		q = "SELECT table_name FROM information_schema.tables WHERE table_schema = DATABASE()"
	}
	require.NoError(t, fdb.sqlDB.Raw(q).Scan(&names).Error)
	return names
}

func dropTable(t *testing.T, fdb *fuzzDB, name string) {
	for _, n := range []string{name, strings.ToLower(name)} {
		q := fmt.Sprintf(`DROP TABLE IF EXISTS %q`, n)
		if fdb.name == "mysql" {
			q = "DROP TABLE IF EXISTS `" + n + "`"
		}
		require.NoError(t, fdb.sqlDB.Exec(q).Error)
	}
}

func slicesWithout(all []string, drop ...string) []string {
	var out []string
	for _, s := range all {
		keep := true
		for _, d := range drop {
			if s == d {
				keep = false
			}
		}
		if keep {
			out = append(out, s)
		}
	}
	return out
}
