package outboxui_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/internal/pgtest"
	"github.com/gorm-outbox/outbox/outboxui"
)

// TestOverviewLogical: in Logical mode the overview shows the replication
// slot, whether a relay streams it and its lag, and charts the lag it
// samples; the pages work on its table (which holds the events the relay
// parked to retry). It runs on a PostgreSQL cluster of its own with
// wal_level=logical.
func TestOverviewLogical(t *testing.T) {
	long(t, "a PostgreSQL cluster of its own, with wal_level=logical, and a headless Chromium")
	srv, err := pgtest.Start("wal_level=logical", "max_replication_slots=10", "max_wal_senders=10")
	if errors.Is(err, pgtest.ErrNoBinaries) && !strict() {
		t.Skipf("needs a PostgreSQL installation: %v", err)
	}
	require.NoError(t, err)
	t.Cleanup(srv.Close)
	db, err := gorm.Open(postgres.Open(srv.DSN("postgres")), &gorm.Config{Logger: logger.Discard})
	require.NoError(t, err)
	t.Cleanup(func() {
		if sqlDB, err := db.DB(); err == nil {
			_ = sqlDB.Close()
		}
	})
	ob := outbox.Plugin(outbox.Config{Mode: outbox.Logical, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, db.Use(ob))
	delivered := make(chan string, 10)
	ob.Handle("*", func(_ context.Context, ev outbox.Event) error {
		if ev.Type == "fails" {
			return outbox.Permanent(errors.New("no"))
		}
		delivered <- ev.ID
		return nil
	})
	require.NoError(t, outbox.PublishAlone(db, outbox.Event{ID: "l-1", Type: "ok"}, outbox.Event{ID: "l-2", Type: "fails"}))

	mux := http.NewServeMux()
	mux.Handle("/ops/outbox/", http.StripPrefix("/ops/outbox", outboxui.Handler(db, ob, outboxui.Options{Logger: slog.New(slog.DiscardHandler)})))
	s := httptest.NewServer(mux)
	t.Cleanup(s.Close)
	get := func() string {
		resp, err := http.Get(s.URL + "/ops/outbox/")
		require.NoError(t, err)
		b := readBody(t, resp)
		require.Equal(t, http.StatusOK, resp.StatusCode, b)
		return b
	}

	body := get()
	assert.Contains(t, body, `id="slot">no relay streams it; lag `)
	assert.Contains(t, body, `id="chart-lag"`)

	ctx, cancel := context.WithCancel(t.Context())
	relay, err := ob.Relay(db, outbox.RelayConfig{})
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- relay.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	select {
	case id := <-delivered:
		require.Equal(t, "l-1", id)
	case <-time.After(30 * time.Second):
		t.Fatal("the relay delivered nothing in 30 s")
	}
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(body, `id="count-failed">1<`) || !strings.Contains(body, `id="slot">streaming to a relay`) {
		require.True(t, time.Now().Before(deadline), "the overview never showed the slot streaming and the parked failure: %s", body)
		time.Sleep(100 * time.Millisecond) // polling the page, as an operator's browser does
		body = get()
	}
	// Two samples at least a second apart make a line of the lag.
	time.Sleep(1100 * time.Millisecond)
	body = get()
	i := strings.Index(body, `id="chart-lag"`)
	require.GreaterOrEqual(t, i, 0)
	lag := body[i : i+strings.Index(body[i:], "</figure>")]
	assert.GreaterOrEqual(t, strings.Count(lag, "<tr><th scope=\"row\">"), 2, "a row of values per sample: %s", lag)

	// The pages in Chromium, on a phone too: the overview with the slot
	// and its lag chart, the list and the parked event's page.
	b := newTab(t, 1280, 900)
	base := s.URL + "/ops/outbox/"
	b.open(base, "#chart-lag svg")
	b.a11y("the Logical mode overview")
	assert.Contains(t, b.text("#slot"), "streaming to a relay")
	assert.Equal(t, "1", b.text("#count-failed"))
	b.open(base+"events?status=failed", "table.rows")
	assert.Contains(t, b.text("table.rows"), "l-2")
	b.open(base+"event?id=l-2", "#status")
	assert.Equal(t, "failed", b.text("#status"))
	assert.Contains(t, b.text("#history"), "failed, gave up", "the parked failure's history")
	b.phone()
	b.open(base, "#chart-lag svg")
	b.fitsWidth("the Logical mode overview at 390 px", 390)
}
