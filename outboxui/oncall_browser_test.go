package outboxui_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/outboxui"
)

// seedOnCall is seedRealistic's bad night, and a partner's billing
// webhook answering 503: three invoices wait for their retry, in
// backoff; and an order webhook removed for good, with a long error.
func seedOnCall(e *env) {
	seedRealistic(e)
	e.retryTypes = map[string]bool{"invoice.sent": true}
	e.failTypes["order.webhook"] = true
	e.failWith = "410 Gone from https://hooks.shop.example/orders/v2/callbacks: the endpoint was removed on 2026-11-30; " +
		"re-register the webhook in the partner console (request id 7f3e9c2d-5e6f-4a8b-9c0d-1a2b3c4d5e6f)"
	e.publish(outbox.Event{ID: "hook-1002", Type: "order.webhook", AggregateType: "order", AggregateID: "1002"})
	e.drain()
	setText(&e.retryWith, "503 Service Unavailable from billing.partner.example: try again later")
	e.publish(
		outbox.Event{ID: "inv-1001", Type: "invoice.sent", AggregateType: "invoice", AggregateID: "1001"},
		outbox.Event{ID: "inv-1002", Type: "invoice.sent", AggregateType: "invoice", AggregateID: "1002"},
		outbox.Event{ID: "inv-1006", Type: "invoice.sent", AggregateType: "invoice", AggregateID: "1006"},
	)
	e.drain()
	e.publish(outbox.Event{ID: "ord-1008", Type: "order.created", AggregateType: "order", AggregateID: "1008"})
}

// TestBrowserOnCall drives, in Chromium, what the on-call engineer sees
// first: the warning at the top of the overview and the list when events
// are pending and no relay runs; "next attempt" on the rows in backoff;
// last errors on one line, cut with an ellipsis, in a table that fits
// 1280 px; an event's actions above the fold; Retry now, of one event and
// by filter, with its confirmation; then relays starting, the warning
// gone in place, the relays panel with each relay's last claim, delivery
// and error, and the warning again when the oldest pending event passes
// MaxPendingAge. With OUTBOXUI_SCREENSHOTS=1 it rewrites warning.png,
// list-oncall.png, event-retry.png, confirm-retry.png and relays.png in
// docs/images/outboxui.
func TestBrowserOnCall(t *testing.T) {
	e := setup(t, backends(t)[0], outboxui.Options{AllowActions: true, Title: "Outbox · orders-service",
		Refresh: 300 * time.Millisecond, Identity: func(*http.Request) string { return "alice@example.com" }})
	seedOnCall(e)
	b := newTab(t, 1280, 900)

	// The overview: the warning first, above the counts.
	b.open(e.base, "#chart-flow svg")
	b.a11y("the overview with a warning")
	b.fitsWidth("the overview with a warning", 1280)
	require.Equal(t, "No relay is running", b.text("#warning-heading"))
	assert.Contains(t, b.text("#warning-no-relay"), "4 events are pending and nothing delivers them: no relay of this table has recorded itself in the last 15 s (none ever has)")
	assert.Equal(t, "alert", b.eval(`document.querySelector("section.warning").getAttribute("role")`))
	assert.Equal(t, true, b.eval(`(() => { const w = document.querySelector("section.warning").getBoundingClientRect();
		return w.bottom <= innerHeight && w.bottom <= document.querySelector("#live-cards").getBoundingClientRect().top })()`),
		"the warning is in the first screenful, above the counts")
	assert.Equal(t, "No relay has recorded itself in the last 15 s, nor ever.", b.text("#no-relays"))
	b.shot("warning.png")

	// The list: the warning too, next attempt on the rows in backoff, and
	// each last error on one line within the table's box at 1280 px.
	b.open(e.base+"events", "table.rows")
	b.fitsWidth("the list at 1280 px", 1280)
	b.a11y("the list with a warning")
	assert.Equal(t, true, b.eval(`document.querySelector("section.warning").getBoundingClientRect().bottom <= document.querySelector("form.filter").getBoundingClientRect().top`),
		"the warning comes before the filter")
	inv := e.row("inv-1001")
	assert.Equal(t, "pending next attempt "+clock(inv.AvailableAt),
		b.text(`tr:has(a[href="event?id=inv-1001"]) td.state`))
	assert.Equal(t, "pending", b.text(`tr:has(a[href="event?id=ord-1008"]) td.state`), "a due event has no next attempt")
	var cells []struct {
		Line, Cut, Ellipsis, Inside bool
		Title, Text                 string
	}
	require.NoError(t, json.Unmarshal([]byte(b.eval(`JSON.stringify(Array.from(document.querySelectorAll("table.rows td.err .cut")).map(c => {
		const wrap = c.closest(".table-wrap").getBoundingClientRect(), td = c.closest("td").getBoundingClientRect();
		const line = parseFloat(getComputedStyle(c).lineHeight);
		return {Line: c.getBoundingClientRect().height < 1.5 * line, Cut: c.scrollWidth > c.clientWidth,
			Ellipsis: getComputedStyle(c).textOverflow === "ellipsis", Inside: td.right <= wrap.right + 0.5,
			Title: c.title, Text: c.textContent};
	}))`).(string)), &cells))
	require.Len(t, cells, 7, "the seven events with an error")
	for _, c := range cells {
		assert.True(t, c.Line, "one line: %q", c.Text)
		assert.True(t, c.Inside, "inside the table's box, not clipped: %q", c.Text)
		assert.True(t, c.Ellipsis, "cut with an ellipsis where it does not fit: %q", c.Text)
		assert.Equal(t, c.Title, c.Text, "the title holds the whole text")
		if strings.HasPrefix(c.Text, "410 Gone") {
			assert.True(t, c.Cut, "the long one is cut: %q", c.Text)
		}
	}
	assert.Equal(t, true, b.eval(`(() => { const c = document.querySelector("tr:has(a[href='event?id=hook-1002']) td.err .cut"); return c.clientWidth >= 200 })()`),
		"the cause has room: 200 px at least at 1280")
	assert.Equal(t, true, b.eval(`(() => { const w = document.querySelector("#live-list .table-wrap"); return w.scrollWidth <= w.clientWidth })()`),
		"the table needs no sideways scroll at 1280 px")
	b.shot("list-oncall.png")

	// An event in backoff: when, and Retry now, in the first screenful.
	b.open(e.base+"event?id=inv-1001", "#status")
	b.a11y("an event in backoff")
	assert.Equal(t, fmt.Sprintf("next attempt at %s UTC (in", inv.AvailableAt.UTC().Format("2006-01-02 15:04:05.000")),
		b.text("#next-attempt")[:len("next attempt at 2006-01-02 15:04:05.000 UTC (in")])
	assert.Equal(t, true, b.eval(`document.querySelector("#retry").getBoundingClientRect().bottom <= innerHeight`), "Retry now above the fold")
	assert.Equal(t, true, b.eval(`document.querySelector("#retry").getBoundingClientRect().bottom <= document.querySelector("#last-error-heading").getBoundingClientRect().top`),
		"before the error and the history")
	b.shot("event-retry.png")
	b.click("#retry", 200)
	assert.Equal(t, "Retried 1 event now by alice@example.com: due now, attempts kept.", b.text("#flash"))
	assert.Contains(t, b.text("#history"), "retried now")
	assert.Contains(t, b.text("#history"), "alice@example.com")
	assert.Equal(t, false, b.eval(`!!document.querySelector("#retry")`), "due now: nothing more to retry")
	assert.False(t, e.row("inv-1001").AvailableAt.After(time.Now()))
	assert.Equal(t, 1, e.row("inv-1001").Attempts, "attempts kept")

	// By filter: the button says how many, the confirmation asks.
	b.open(e.base+"events?type=invoice.sent", "table.rows")
	assert.Equal(t, "Retry now 2 pending events waiting for a retry where type is invoice.sent…", b.text("#bulk-retry"))
	b.click("#bulk-retry", 200)
	assert.Equal(t, "Retry now 2 pending events waiting for a retry where type is invoice.sent?", b.text("#confirm-scope"))
	assert.Equal(t, "pending waiting for a retry 2 made due now, attempts kept", b.text("#tally-waiting"))
	assert.Equal(t, "pending due already, or being delivered 1 left alone: nothing to retry", b.text("#tally-due"))
	b.a11y("a retry's confirmation")
	b.fitsWidth("a retry's confirmation", 1280)
	b.shot("confirm-retry.png")
	b.click("#confirm", 200)
	assert.Equal(t, "Retried 2 events now by alice@example.com: due now, attempts kept.", b.text("#flash"))
	for _, id := range []string{"inv-1002", "inv-1006"} {
		assert.False(t, e.row(id).AvailableAt.After(time.Now()), id)
	}

	// Relays start: the warning goes, in place, and the relays panel
	// shows them; the billing webhook still answers 503, the mail server
	// is down.
	e.downTypes = map[string]bool{"email.welcome": true}
	setText(&e.downWith, "smtp.example.com:587: connection refused")
	b.open(e.base, "#chart-flow svg")
	b.do(chromedp.Evaluate[chromedp.Void](`document.querySelector("#live-warning").dataset.same = "1"`))
	e.runRelay("orders-relay-1")
	e.runRelay("orders-relay-2")
	b.poll(`!document.querySelector("section.warning") && document.querySelectorAll("#relays tbody tr").length === 2`,
		"the warning goes and the relays arrive, without a reload")
	assert.Equal(t, "1", b.eval(`document.querySelector("#live-warning").dataset.same`), "in the same region")
	// A mail for a server that is down is handed back by whichever relay
	// claims it, which records the error.
	e.publish(outbox.Event{ID: "mail-1009", Type: "email.welcome", AggregateType: "user", AggregateID: "77"})
	e.waitStats(func(st outbox.Stats) bool {
		for _, r := range st.Relays {
			if strings.Contains(r.LastError, "connection refused") {
				return true
			}
		}
		return false
	}, "a relay recorded the mail server down")
	// The invoices went back into backoff; one was created 12 minutes ago.
	e.waitStats(func(st outbox.Stats) bool { return st.Pending == 4 }, "the order delivered, the invoices attempted again, the mail handed back")
	e.backdate("inv-1002", time.Now().Add(-12*time.Minute))
	b.poll(`!!document.querySelector("#warning-behind") && /connection refused/.test(document.querySelector("#relays").textContent)`,
		"the warning that delivery is behind, and the relay's error, arrive in place")
	assert.Equal(t, "Delivery is behind", b.text("#warning-heading"))
	assert.Contains(t, b.text("#warning-behind"), "more than 5m ago, though 2 relays are running: delivery is stuck or behind.")
	rows := b.text("#relays tbody")
	assert.Contains(t, rows, "orders-relay-1")
	assert.Contains(t, rows, "orders-relay-2")
	assert.Contains(t, rows, "persistent")
	b.a11y("the overview with relays")
	b.fitsWidth("the overview with relays", 1280)
	b.shot("relays.png")

	// A phone: the warning and the relays fit, the tables scroll in their
	// boxes, the errors keep their width.
	b.phone()
	for _, p := range []struct{ url, sel, name string }{
		{"", "#relays", "the overview with relays"},
		{"events", "table.rows", "the list"},
		{"event?id=inv-1002", "#status", "an event in backoff"},
	} {
		b.open(e.base+p.url, p.sel)
		b.fitsWidth(p.name+" at 390 px", 390)
	}
	b.open(e.base+"events", "table.rows")
	assert.Equal(t, true, b.eval(`Array.from(document.querySelectorAll("table.rows td.err")).every(td => td.getBoundingClientRect().width >= 14 * parseFloat(getComputedStyle(document.documentElement).fontSize) - 1)`),
		"on a phone the error column keeps 14rem, and the table scrolls in its box")
}
