package outboxui_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	mysqldriver "github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"
	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/outboxtest"
	"github.com/gorm-outbox/outbox/outboxui"
)

// The rules of the repository's two test commands (README, "Testing";
// docs/testing.md), kept here rather than imported: this module requires
// the core at its release version.
const fullEnv = "OUTBOX_TEST_FULL"

// full: the full suite runs (OUTBOX_TEST_FULL=1, what CI runs).
func full() bool { return os.Getenv(fullEnv) == "1" }

// strict: a missing prerequisite (Chromium, PostgreSQL's server binaries)
// fails the test instead of skipping it, in the full suite and under CI,
// where a skip would turn a broken set-up green.
func strict() bool { return full() || os.Getenv("CI") != "" }

// runSelected: go test was given -run, so the tests it runs were named.
func runSelected() bool {
	f := flag.Lookup("test.run")
	return f != nil && f.Value.String() != ""
}

// long marks a test that starts a browser or a server of its own and takes
// its time: it runs in the full suite or when -run names it, so that the
// quick command stays quick. what says what makes it long.
func long(t testing.TB, what string) {
	t.Helper()
	if full() || runSelected() {
		return
	}
	t.Skipf("a long test (%s): it runs with %s=1 (the full suite) or when -run names it", what, fullEnv)
}

// backend opens a fresh, empty database for one test.
type backend struct {
	name string
	open func(t testing.TB) *gorm.DB
	// timeArg is how this database's driver stores a time the way the
	// outbox writes it (UTC), for back-dating rows in tests.
	timeArg func(time.Time) any
}

// backends are SQLite always, PostgreSQL and MariaDB when their DSN is set
// (skipped, and saying so, otherwise; failing when set and unreachable).
func backends(t testing.TB) []backend {
	bs := []backend{{
		name: "sqlite",
		open: func(t testing.TB) *gorm.DB {
			dsn := "file:" + filepath.Join(t.TempDir(), "test.db") + outbox.SQLiteDSNOptions
			return openDB(t, sqlite.Open(dsn))
		},
		timeArg: func(tm time.Time) any { return tm.UTC().Format("2006-01-02 15:04:05.999999999-07:00") },
	}}
	if dsn := os.Getenv("OUTBOX_TEST_POSTGRES_DSN"); dsn != "" {
		admin := openDB(t, postgres.Open(dsn))
		bs = append(bs, backend{
			name: "postgres",
			open: func(t testing.TB) *gorm.DB {
				schema := "ui_" + randomName()
				require.NoError(t, admin.Exec("CREATE SCHEMA "+schema).Error)
				t.Cleanup(func() { _ = admin.Exec("DROP SCHEMA " + schema + " CASCADE").Error })
				sep := "?"
				if strings.Contains(dsn, "?") {
					sep = "&"
				}
				return openDB(t, postgres.Open(dsn+sep+"search_path="+schema))
			},
			timeArg: func(tm time.Time) any { return tm.UTC() },
		})
	} else {
		t.Log("OUTBOX_TEST_POSTGRES_DSN is not set: PostgreSQL skipped")
	}
	if dsn := os.Getenv("OUTBOX_TEST_MYSQL_DSN"); dsn != "" {
		cfg, err := mysqldriver.ParseDSN(dsn)
		require.NoError(t, err, "OUTBOX_TEST_MYSQL_DSN")
		admin := openDB(t, mysql.Open(dsn))
		bs = append(bs, backend{
			name: "mysql",
			open: func(t testing.TB) *gorm.DB {
				name := "ui_" + randomName()
				require.NoError(t, admin.Exec("CREATE DATABASE "+name).Error)
				t.Cleanup(func() { _ = admin.Exec("DROP DATABASE " + name).Error })
				c := cfg.Clone()
				c.DBName = name
				return openDB(t, mysql.Open(c.FormatDSN()))
			},
			timeArg: func(tm time.Time) any { return tm.UTC().Format("2006-01-02 15:04:05.000000") },
		})
	} else {
		t.Log("OUTBOX_TEST_MYSQL_DSN is not set: MySQL/MariaDB skipped")
	}
	return bs
}

func randomName() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func openDB(t testing.TB, d gorm.Dialector) *gorm.DB {
	db, err := gorm.Open(d, &gorm.Config{Logger: logger.Discard})
	require.NoError(t, err)
	sqlDB, err := db.DB()
	require.NoError(t, err)
	require.NoError(t, sqlDB.Ping(), "database unreachable")
	t.Cleanup(func() { _ = sqlDB.Close() })
	return db
}

// env is one test's database, outbox, relay and dashboard.
type env struct {
	t      testing.TB
	b      backend
	db     *gorm.DB
	ob     *outbox.Outbox
	relay  *outbox.Relay
	srv    *httptest.Server
	base   string // the dashboard's URL, ending in a slash
	client *http.Client
	// failWith, when not empty, makes the events whose type starts with
	// "fails" (or holds markup, or is in failTypes) fail permanently with
	// this text.
	failWith string
	// failTypes are more types that fail with failWith.
	failTypes map[string]bool
	// retryWith, when not empty, makes the events whose type starts with
	// "retries" fail with this text, to be retried: pending again, due
	// after the relay's backoff (10 minutes). downWith makes those whose
	// type starts with "down" find their destination down (Unavailable):
	// handed back, the relay's cycle ends with that error. Both may change
	// while a relay runs (runRelay).
	retryWith, downWith atomic.Pointer[string]
	// retryTypes and downTypes are more types that fail with retryWith
	// and downWith; set them before a relay runs.
	retryTypes, downTypes map[string]bool
}

// backoff is the test relays' wait before a retry: long enough that an
// event in backoff stays there for the test.
const backoff = 10 * time.Minute

// setText sets a failure switch of the env.
func setText(p *atomic.Pointer[string], s string) { p.Store(&s) }

func loadText(p *atomic.Pointer[string]) string {
	if s := p.Load(); s != nil {
		return *s
	}
	return ""
}

// setup installs the outbox on a fresh database and mounts the dashboard
// at /ops/outbox/ behind http.StripPrefix, as a service would.
func setup(t testing.TB, b backend, opts outboxui.Options) *env {
	e := &env{t: t, b: b, db: b.open(t)}
	e.ob = outbox.Plugin(outbox.Config{Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, e.db.Use(e.ob))
	e.ob.Handle("*", func(_ context.Context, ev outbox.Event) error {
		if e.failWith != "" && (strings.HasPrefix(ev.Type, "fails") || strings.Contains(ev.Type, "<") || e.failTypes[ev.Type]) {
			return outbox.Permanent(errors.New(e.failWith))
		}
		if msg := loadText(&e.retryWith); msg != "" && (strings.HasPrefix(ev.Type, "retries") || e.retryTypes[ev.Type]) {
			return errors.New(msg)
		}
		if msg := loadText(&e.downWith); msg != "" && (strings.HasPrefix(ev.Type, "down") || e.downTypes[ev.Type]) {
			return outbox.Unavailable(errors.New(msg))
		}
		return nil
	})
	e.failWith = "broker said no"
	setText(&e.retryWith, "connection refused")
	setText(&e.downWith, "smtp.example.com:587: connection refused")
	e.relay = outboxtest.Relay(t, e.ob, e.db, outbox.RelayConfig{Backoff: func(int) time.Duration { return backoff }})
	e.mount(opts)
	return e
}

// mount serves the dashboard, with opts, at /ops/outbox/ behind
// http.StripPrefix, as a service would.
func (e *env) mount(opts outboxui.Options) {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	mux := http.NewServeMux()
	mux.Handle("/ops/outbox/", http.StripPrefix("/ops/outbox", outboxui.Handler(e.db, e.ob, opts)))
	e.srv = httptest.NewServer(mux)
	e.t.Cleanup(e.srv.Close)
	e.base = e.srv.URL + "/ops/outbox/"
	jar, err := cookiejar.New(nil)
	require.NoError(e.t, err)
	e.client = &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

// setupShared mounts another dashboard, with opts, on e's database and
// outbox.
func setupShared(t testing.TB, e *env, opts outboxui.Options) *env {
	o := &env{t: t, b: e.b, db: e.db, ob: e.ob, relay: e.relay}
	o.mount(opts)
	return o
}

// runRelay runs a relay named name until the test ends, as a service
// does, and waits (polling Stats, up to a deadline) until it has recorded
// itself.
func (e *env) runRelay(name string) {
	e.t.Helper()
	r := outboxtest.Relay(e.t, e.ob, e.db, outbox.RelayConfig{Name: name, Backoff: func(int) time.Duration { return backoff },
		PollInterval: 50 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	e.t.Cleanup(func() { cancel(); <-done })
	e.waitStats(func(st outbox.Stats) bool {
		return slices.ContainsFunc(st.Relays, func(rs outbox.RelayStatus) bool { return rs.Name == name })
	}, "relay "+name+" recorded itself")
}

// waitStats polls Stats until ok says it is as wanted, up to a deadline.
func (e *env) waitStats(ok func(outbox.Stats) bool, what string) outbox.Stats {
	e.t.Helper()
	var st outbox.Stats
	require.Eventually(e.t, func() bool {
		var err error
		st, err = e.ob.Stats(e.db.WithContext(context.Background()))
		return err == nil && ok(st)
	}, 30*time.Second, 20*time.Millisecond, what)
	return st
}

// publish writes events in one transaction.
func (e *env) publish(events ...outbox.Event) {
	e.t.Helper()
	require.NoError(e.t, e.db.Transaction(func(tx *gorm.DB) error { return outbox.Publish(tx, events...) }))
}

// drain runs the relay until it claims nothing.
func (e *env) drain() {
	e.t.Helper()
	for {
		n, err := e.relay.ProcessOnce(e.t.Context())
		require.NoError(e.t, err)
		if n == 0 {
			return
		}
	}
}

func (e *env) row(id string) outbox.Row {
	e.t.Helper()
	r, err := e.ob.Get(e.db.WithContext(e.t.Context()), id)
	require.NoError(e.t, err)
	return r
}

// backdate sets an event's created_at.
func (e *env) backdate(id string, at time.Time) {
	e.t.Helper()
	res := e.db.Exec("UPDATE "+e.ob.Table()+" SET created_at = ? WHERE named_id = ?", e.b.timeArg(at), id)
	require.NoError(e.t, res.Error)
	require.EqualValues(e.t, 1, res.RowsAffected)
}

// get fetches a page relative to the dashboard and returns its status and body.
func (e *env) get(path string) (int, string) {
	e.t.Helper()
	resp, err := e.client.Get(e.base + path)
	require.NoError(e.t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(e.t, err)
	return resp.StatusCode, string(body)
}

// post sends a form the way the dashboard's own pages do (same origin).
func (e *env) post(path string, form url.Values, header ...string) *http.Response {
	e.t.Helper()
	req, err := http.NewRequestWithContext(e.t.Context(), http.MethodPost, e.base+path, strings.NewReader(form.Encode()))
	require.NoError(e.t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := e.client.Do(req)
	require.NoError(e.t, err)
	e.t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// follow GETs the page a redirect sends the browser to.
func (e *env) follow(resp *http.Response) (int, string) {
	e.t.Helper()
	loc := resp.Header.Get("Location")
	require.NotEmpty(e.t, loc, "no redirect")
	return e.get(loc)
}

var csrfRE = regexp.MustCompile(`name="csrf" value="([0-9a-f]{64})"`)

// token loads a page and returns the form token it carries.
func (e *env) token() string {
	e.t.Helper()
	code, body := e.get("events")
	require.Equal(e.t, http.StatusOK, code, body)
	m := csrfRE.FindStringSubmatch(body)
	require.NotNil(e.t, m, "no form token on the list page")
	return m[1]
}

func readBody(t testing.TB, resp *http.Response) string {
	t.Helper()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(b)
}
