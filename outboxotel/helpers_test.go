package outboxotel_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	mysqldriver "github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/outboxotel"
	"github.com/gorm-outbox/outbox/outboxtest"
)

const (
	postgresDSNEnv = "OUTBOX_TEST_POSTGRES_DSN"
	mysqlDSNEnv    = "OUTBOX_TEST_MYSQL_DSN"
	natsURLEnv     = "OUTBOX_TEST_NATS_URL"
	defaultNATSURL = "nats://127.0.0.1:4222"
	fullEnv        = "OUTBOX_TEST_FULL"
	natsStartCmd   = "start-stop-daemon --start --oknodo --background --exec /usr/sbin/nats-server -- -a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server -l /var/log/nats-server.log"
)

// The rules of the repository's two test commands (README, "Testing";
// docs/testing.md), kept here rather than imported: this module requires
// the core at its release version.

// full: the full suite runs (OUTBOX_TEST_FULL=1, what CI runs).
func full() bool { return os.Getenv(fullEnv) == "1" }

// strict: a missing broker or PostgreSQL's server binaries fail the test
// instead of skipping it, in the full suite and under CI, where a skip
// would turn a broken set-up green.
func strict() bool { return full() || os.Getenv("CI") != "" }

// runSelected: go test was given -run, so the tests it runs were named.
func runSelected() bool {
	f := flag.Lookup("test.run")
	return f != nil && f.Value.String() != ""
}

// long marks a test that starts a server of its own and takes its time: it
// runs in the full suite or when -run names it, so that the quick command
// stays quick. what says what makes it long.
func long(t testing.TB, what string) {
	t.Helper()
	if full() || runSelected() {
		return
	}
	t.Skipf("a long test (%s): it runs with %s=1 (the full suite) or when -run names it", what, fullEnv)
}

// natsURL is the JetStream server's address. Unset, the test skips at once
// (the quick command needs nothing installed), except in strict mode,
// where the default address must answer: the broker was asked for, so an
// unreachable one fails the test.
func natsURL(t testing.TB) string {
	t.Helper()
	if url := os.Getenv(natsURLEnv); url != "" {
		return url
	}
	if !strict() {
		t.Skipf("needs NATS with JetStream: set %s (e.g. %s) to run it", natsURLEnv, defaultNATSURL)
	}
	return defaultNATSURL
}

// backend opens a fresh, empty database for one test.
type backend struct {
	name string
	open func(t testing.TB) *gorm.DB
}

func backends(t testing.TB) []backend {
	bs := []backend{{name: "SQLite", open: func(t testing.TB) *gorm.DB {
		return openGorm(t, sqlite.Open("file:"+filepath.Join(t.TempDir(), "outbox.db")+outboxtest.DSNOptions))
	}}}
	bs = append(bs, backend{name: "PostgreSQL", open: func(t testing.TB) *gorm.DB {
		dsn := os.Getenv(postgresDSNEnv)
		if dsn == "" {
			t.Skipf("%s is not set", postgresDSNEnv)
		}
		admin := openGorm(t, postgres.Open(dsn))
		schema := "t_" + randomName()
		require.NoError(t, admin.Exec("CREATE SCHEMA "+schema).Error)
		t.Cleanup(func() { _ = admin.Exec("DROP SCHEMA " + schema + " CASCADE").Error })
		sep := "?"
		if strings.Contains(dsn, "?") {
			sep = "&"
		}
		return openGorm(t, postgres.Open(dsn+sep+"search_path="+schema))
	}})
	bs = append(bs, backend{name: "MariaDB", open: func(t testing.TB) *gorm.DB {
		dsn := os.Getenv(mysqlDSNEnv)
		if dsn == "" {
			t.Skipf("%s is not set", mysqlDSNEnv)
		}
		cfg, err := mysqldriver.ParseDSN(dsn)
		require.NoError(t, err)
		admin := openGorm(t, mysql.Open(dsn))
		name := "t_" + randomName()
		require.NoError(t, admin.Exec("CREATE DATABASE "+name).Error)
		t.Cleanup(func() { _ = admin.Exec("DROP DATABASE " + name).Error })
		c := cfg.Clone()
		c.DBName = name
		return openGorm(t, mysql.Open(c.FormatDSN()))
	}})
	return bs
}

func openGorm(t testing.TB, d gorm.Dialector) *gorm.DB {
	t.Helper()
	db, err := gorm.Open(d, &gorm.Config{Logger: logger.Discard})
	require.NoError(t, err)
	t.Cleanup(func() {
		if sqlDB, err := db.DB(); err == nil {
			_ = sqlDB.Close()
		}
	})
	return db
}

func randomName() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// telemetry is an SDK that records spans in memory and a manual metric
// reader.
type telemetry struct {
	spans  *tracetest.SpanRecorder
	tp     *sdktrace.TracerProvider
	reader *sdkmetric.ManualReader
	mp     *sdkmetric.MeterProvider
	// waiting counts the create spans of the outbox install instrumented
	// that wait for their event's Stored hook.
	waiting func() int
}

func newTelemetry(t *testing.T) *telemetry {
	tel := &telemetry{spans: tracetest.NewSpanRecorder(), reader: sdkmetric.NewManualReader()}
	tel.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(tel.spans))
	tel.mp = sdkmetric.NewMeterProvider(sdkmetric.WithReader(tel.reader))
	t.Cleanup(func() {
		_ = tel.tp.Shutdown(context.Background())
		_ = tel.mp.Shutdown(context.Background())
	})
	return tel
}

func (tel *telemetry) options(extra ...outboxotel.Option) []outboxotel.Option {
	return append([]outboxotel.Option{outboxotel.WithTracerProvider(tel.tp), outboxotel.WithMeterProvider(tel.mp)}, extra...)
}

// install puts a plugin configured by cfg on db and instruments it.
func (tel *telemetry) install(t *testing.T, db *gorm.DB, cfg outbox.Config, extra ...outboxotel.Option) *outbox.Outbox {
	t.Helper()
	cfg.Logger = slog.New(slog.DiscardHandler)
	ob := outbox.Plugin(cfg)
	require.NoError(t, db.Use(ob))
	opts := tel.options(extra...)
	if cfg.Mode != outbox.Memory {
		opts = append(opts, outboxotel.WithStats(db))
	}
	waiting, err := outboxotel.InstrumentCounting(ob, opts...)
	require.NoError(t, err)
	tel.waiting = waiting
	t.Cleanup(func() { assert.Zero(t, waiting(), "create spans still waiting for their Stored hook") })
	return ob
}

// span returns the one ended span named name.
func (tel *telemetry) span(t *testing.T, name string) sdktrace.ReadOnlySpan {
	t.Helper()
	var found []sdktrace.ReadOnlySpan
	for _, s := range tel.spans.Ended() {
		if s.Name() == name {
			found = append(found, s)
		}
	}
	require.Len(t, found, 1, "spans named %q", name)
	return found[0]
}

func (tel *telemetry) spansNamed(name string) []sdktrace.ReadOnlySpan {
	var found []sdktrace.ReadOnlySpan
	for _, s := range tel.spans.Ended() {
		if s.Name() == name {
			found = append(found, s)
		}
	}
	return found
}

func (tel *telemetry) collect(t *testing.T) metricdata.ResourceMetrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, tel.reader.Collect(context.Background(), &rm))
	return rm
}

func findMetric(rm metricdata.ResourceMetrics, name string) (metricdata.Metrics, bool) {
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == name {
				return m, true
			}
		}
	}
	return metricdata.Metrics{}, false
}

// parentOf reads the span context a traceparent header names.
func parentOf(headers map[string]string) trace.SpanContext {
	ctx := propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier(headers))
	return trace.SpanContextFromContext(ctx)
}
