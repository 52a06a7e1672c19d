package outboxui_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/outboxui"
)

// chromium finds a Chromium to drive: $OUTBOXUI_CHROMIUM, or Debian's
// chromium package, or another name Chrome goes by.
func chromium(t *testing.T) string {
	if p := os.Getenv("OUTBOXUI_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	msg := "no Chromium found (apt-get install -y chromium, or set OUTBOXUI_CHROMIUM to a Chrome binary)"
	if os.Getenv("CI") == "true" {
		t.Fatal(msg) // CI must run the browser test, never skip it
	}
	t.Skip(msg)
	return ""
}

// TestBrowser drives the dashboard in a real headless Chromium, as the
// on-call engineer would: open the list, filter to failed, open the
// event, replay it, see it delivered; a payload holding a script renders
// as text. Set OUTBOXUI_SCREENSHOT=1 to rewrite screenshot.png (the
// README's) from the list page.
func TestBrowser(t *testing.T) {
	exe := chromium(t)
	e := setup(t, backends(t)[0], outboxui.Options{AllowActions: true, ShowPayloads: true, Title: "Outbox · orders-service"})
	seedRealistic(e)

	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(exe),
		chromedp.NoSandbox, // CI runs as root, where Chromium's sandbox refuses to start
		chromedp.DisableGPU,
		chromedp.WindowSize(1400, 900),
	)
	actx, cancel := chromedp.NewExecAllocator(t.Context(), opts...)
	defer cancel()
	ctx, cancel := chromedp.NewContext(actx)
	defer cancel()
	ctx, cancel = context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	// Starts the browser, so that the listener below has a tab to watch.
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate("about:blank")))

	// A script that ran would most likely alert: count dialogs, close them.
	var dialogs atomic.Int32
	go func() {
		for _, err := range chromedp.Events(ctx, page.JavascriptDialogOpening) {
			if err != nil {
				return
			}
			dialogs.Add(1)
			_, _ = chromedp.Call(ctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{})
		}
	}()
	text := func(sel string) string {
		t.Helper()
		s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
		require.NoError(t, err, sel)
		return strings.TrimSpace(s)
	}
	eval := func(js string) any {
		t.Helper()
		v, err := chromedp.Run(ctx, chromedp.Evaluate[any](js))
		require.NoError(t, err, js)
		return v
	}
	// click follows a link or submits a form and waits for the next page.
	click := func(sel string) {
		t.Helper()
		resp, err := chromedp.RunResponse(ctx, chromedp.Click(chromedp.CSS(sel)))
		require.NoError(t, err, sel)
		require.EqualValues(t, 200, resp.Status, sel)
	}

	// The list, unfiltered: the README's screenshot.
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(e.base+"events"),
		chromedp.WaitVisible(chromedp.CSS("table.rows")),
	))
	shot, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	require.True(t, bytes.HasPrefix(shot, []byte("\x89PNG")), "a PNG")
	out := filepath.Join(t.TempDir(), "screenshot.png")
	if os.Getenv("OUTBOXUI_SCREENSHOT") == "1" {
		out = "screenshot.png"
	}
	require.NoError(t, os.WriteFile(out, shot, 0o644))
	t.Logf("list page screenshot: %s (%d bytes)", out, len(shot))

	// The form shows the filter of a link with several statuses and a page
	// size of its own, and pressing Filter keeps it: the same events, the
	// same count, the same bulk actions.
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(e.base+"events?status=failed,pending&limit=4"),
		chromedp.WaitVisible(chromedp.CSS("table.rows")),
	))
	listed := func() any {
		t.Helper()
		return eval(`JSON.stringify({
			form: new URLSearchParams(new FormData(document.querySelector("form.filter"))).toString(),
			rows: Array.from(document.querySelectorAll("table.rows tbody td.id")).map(td => td.textContent),
			total: document.querySelector("#total").textContent,
			bulk: Array.from(document.querySelectorAll(".bulk form")).map(f =>
				[f.getAttribute("action"), new URLSearchParams(new FormData(f)).toString(), f.querySelector("button").textContent]),
		})`)
	}
	before := listed()
	assert.Contains(t, before, `status=pending&status=failed&`, "the form shows the link's statuses")
	assert.Contains(t, before, `&limit=4&`, "and its page size")
	assert.Contains(t, before, `"total":"5"`)
	assert.Contains(t, before, `"Replay 3 failed events…"`, "replay says what it touches")
	assert.Contains(t, before, `"Purge 3 failed events…"`, "and so does purge: not the pending ones")
	click("#f-apply")
	assert.Equal(t, before, listed(), "pressing Filter changes nothing")

	// Filter to failed with the form.
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(e.base+"events"),
		chromedp.WaitVisible(chromedp.CSS("table.rows")),
	))
	require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS("#f-status-failed"))))
	click("#f-apply")
	loc, err := chromedp.Run(ctx, chromedp.Location())
	require.NoError(t, err)
	assert.Contains(t, loc, "/ops/outbox/events?q=&status=failed") // the search box comes first, empty
	assert.Equal(t, "failed,failed,failed",
		eval(`Array.from(document.querySelectorAll("table.rows tbody .status")).map(s => s.textContent).join(",")`),
		"only the failed events are listed")

	// Open the event whose payload holds a script.
	click(`a[href="event?id=pay-1003"]`)
	assert.Equal(t, "failed", text("#status"))
	assert.Contains(t, text("#last-error"), "card_declined")
	assert.Contains(t, text("#payload"), `<script>window.__xss = true; alert('xss')</script>`, "the payload renders as text")
	assert.EqualValues(t, 0, eval(`document.querySelectorAll("script").length`), "no script element in the page")
	assert.Equal(t, false, eval(`window.__xss === true`), "no script ran")

	// Replay it: the page says so and shows it pending.
	e.failWith = "" // the card processor is back
	click("#replay")
	assert.Regexp(t, `^Replayed 1 event by 127\.0\.0\.1:\d+: pending again, due now\.$`, text(".flash"))
	assert.Equal(t, "pending", text("#status"))

	// The relay delivers it; the page shows it sent.
	e.drain()
	require.NoError(t, chromedp.Do(ctx, chromedp.Reload()))
	assert.Equal(t, "sent", text("#status"))
	assert.Equal(t, outbox.StatusSent, e.row("pay-1003").Status)
	assert.Zero(t, dialogs.Load(), "no dialog opened: no script ran")
}

// seedRealistic fills the table the way a service's looks after a bad
// night: deliveries, a card processor refusing, a mail server down.
func seedRealistic(e *env) {
	e.failTypes = map[string]bool{"payment.captured": true, "email.receipt": true}
	var evs []outbox.Event
	for i := range 6 {
		id := itoa(1001 + i)
		evs = append(evs, outbox.Event{ID: "ord-" + id, Type: "order.created", AggregateType: "order", AggregateID: id,
			Payload: map[string]any{"order": id, "total": 1999 + i}})
	}
	e.publish(evs...)
	e.drain()
	e.publish(
		outbox.Event{ID: "pay-1003", Type: "payment.captured", AggregateType: "order", AggregateID: "1003",
			// Raw, so the stored text holds the tag itself, not JSON's \u003c.
			Payload: json.RawMessage(`{"order": "1003", "note": "<script>window.__xss = true; alert('xss')</script>"}`)},
		outbox.Event{ID: "pay-1005", Type: "payment.captured", AggregateType: "order", AggregateID: "1005",
			Payload: map[string]any{"order": "1005"}},
	)
	e.failWith = "stripe: card_declined (402): insufficient funds"
	e.drain()
	e.publish(outbox.Event{ID: "mail-1004", Type: "email.receipt", AggregateType: "order", AggregateID: "1004",
		Payload: map[string]any{"to": "someone@example.com"}})
	e.failWith = "smtp: 550 5.1.1 mailbox unavailable"
	e.drain()
	e.failWith = "stripe: card_declined (402): insufficient funds"
	e.publish(
		outbox.Event{ID: "ord-1007", Type: "order.created", AggregateType: "order", AggregateID: "1007"},
		outbox.Event{ID: "ship-1001", Type: "shipment.booked", AggregateType: "shipment", AggregateID: strings.Repeat("7", 6)},
	)
}

// TestBrowserFind drives issue 25's first slice in headless Chromium: find
// events with the search box, page forward and back, and watch the list
// refresh in place while the operator is half-way through typing a new
// search, scrolled down the page.
func TestBrowserFind(t *testing.T) {
	exe := chromium(t)
	e := setup(t, backends(t)[0], outboxui.Options{AllowActions: true, Refresh: 200 * time.Millisecond})
	seedRealistic(e)

	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(exe), chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.WindowSize(1280, 500), // short, so the list scrolls
	)
	actx, cancel := chromedp.NewExecAllocator(t.Context(), opts...)
	defer cancel()
	ctx, cancel := chromedp.NewContext(actx)
	defer cancel()
	ctx, cancel = context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	eval := func(js string) any {
		t.Helper()
		v, err := chromedp.Run(ctx, chromedp.Evaluate[any](js))
		require.NoError(t, err, js)
		return v
	}
	click := func(sel string) {
		t.Helper()
		resp, err := chromedp.RunResponse(ctx, chromedp.Click(chromedp.CSS(sel)))
		require.NoError(t, err, sel)
		require.EqualValues(t, 200, resp.Status, sel)
	}
	rows := func() any {
		t.Helper()
		return eval(`Array.from(document.querySelectorAll("table.rows tbody td.id")).map(td => td.textContent).join(",")`)
	}

	// Search: the box takes an event type; the page says how it read it.
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(e.base+"events?limit=3"),
		chromedp.WaitVisible(chromedp.CSS("#f-q")),
		chromedp.SendKeys(chromedp.CSS("#f-q"), "order.created"),
	))
	click("#f-apply")
	loc, err := chromedp.Run(ctx, chromedp.Location())
	require.NoError(t, err)
	assert.Contains(t, loc, "q=order.created")
	assert.Contains(t, eval(`document.querySelector("#in-effect").textContent`), "search “order.created” as event type")
	assert.Equal(t, "ord-1001,ord-1002,ord-1003", rows())
	assert.Equal(t, "7", eval(`document.querySelector("#total").textContent`))

	// Forward, forward, back, back.
	click("#next")
	assert.Equal(t, "ord-1004,ord-1005,ord-1006", rows())
	click("#next")
	assert.Equal(t, "ord-1007", rows())
	assert.Equal(t, false, eval(`!!document.querySelector("#next")`), "the last page has no Next")
	click("#prev")
	assert.Equal(t, "ord-1004,ord-1005,ord-1006", rows())
	click("#prev")
	assert.Equal(t, "ord-1001,ord-1002,ord-1003", rows())
	assert.Equal(t, false, eval(`!!document.querySelector("#prev")`), "back on the first page: no Previous")
	assert.Equal(t, "order.created", eval(`document.querySelector("#f-q").value`), "the search box keeps the search")

	// Live: the search's whole list, scrolled down, a new search half typed.
	var more []outbox.Event
	for i := range 20 {
		more = append(more, outbox.Event{ID: "late-" + itoa(100+i), Type: "order.created"})
	}
	e.publish(more...)
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(e.base+"events?q=order.created"),
		chromedp.WaitVisible(chromedp.CSS("table.rows")),
		chromedp.Poll[chromedp.Void](`/updated \d+s ago/.test(document.querySelector("#updated").textContent)`,
			chromedp.WithPollingTimeout(10*time.Second)), // live.js runs
	))
	assert.Equal(t, "27", eval(`document.querySelector("#total").textContent`))
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Clear(chromedp.CSS("#f-q")),
		chromedp.SendKeys(chromedp.CSS("#f-q"), "pay-10"), // typed, not submitted
	))
	scrolled := eval(`window.scrollTo(0, 250); document.querySelector("#total").dataset.old = "1"; window.scrollY`)
	require.EqualValues(t, 250, scrolled, "the page scrolls")
	e.publish(outbox.Event{ID: "live-1", Type: "order.created"})
	_, err = chromedp.Run(ctx, chromedp.Poll[chromedp.Void](
		`document.querySelector("#total").textContent === "28" && !document.querySelector("#total").dataset.old`,
		chromedp.WithPollingTimeout(15*time.Second)))
	require.NoError(t, err, "the new event arrives without a reload")
	assert.Equal(t, "pay-10", eval(`document.querySelector("#f-q").value`), "the half-typed search is kept")
	assert.Equal(t, "f-q", eval(`document.activeElement.id`), "and so is the focus")
	assert.EqualValues(t, 250, eval(`window.scrollY`), "and the scroll position")
	loc, err = chromedp.Run(ctx, chromedp.Location())
	require.NoError(t, err)
	assert.True(t, strings.HasSuffix(loc, "events?q=order.created"), "and the filter: %s", loc)
	assert.Regexp(t, `^updated \d+s ago$`, eval(`document.querySelector("#updated").textContent`))
	assert.Contains(t, rows(), "live-1")
}
