package outboxui_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/outboxui"
)

// chromium finds a Chromium to drive: $OUTBOXUI_CHROMIUM, or Debian's
// chromium package, or another name Chrome goes by. The browser tests take
// minutes in all, so they wait for the full suite (or -run); there, a
// missing Chromium fails them.
func chromium(t *testing.T) string {
	t.Helper()
	long(t, "drives a headless Chromium")
	if p := os.Getenv("OUTBOXUI_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	msg := "no Chromium found (apt-get install -y chromium, or set OUTBOXUI_CHROMIUM to a Chrome binary)"
	if strict() {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// TestBrowser drives the dashboard in a real headless Chromium, as the
// on-call engineer would: open the list, filter to failed, open the
// event, replay it, see it delivered; a payload holding a script renders
// as text. (TestBrowserLayout takes the README's screenshots.)
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
	assert.Equal(t, "ord-1007,ord-1006,ord-1005", rows(), "newest first")
	assert.Equal(t, "7", eval(`document.querySelector("#total").textContent`))

	// Forward, forward, back, back.
	click("#next")
	assert.Equal(t, "ord-1004,ord-1003,ord-1002", rows())
	click("#next")
	assert.Equal(t, "ord-1001", rows())
	assert.Equal(t, false, eval(`!!document.querySelector("#next")`), "the last page has no Next")
	click("#prev")
	assert.Equal(t, "ord-1004,ord-1003,ord-1002", rows())
	click("#prev")
	assert.Equal(t, "ord-1007,ord-1006,ord-1005", rows())
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

// tab is a headless Chromium tab for one test, with the helpers the
// layout, keyboard and action tests share.
type tab struct {
	t   *testing.T
	ctx context.Context
}

// newTab starts a browser whose window is width × height CSS pixels.
func newTab(t *testing.T, width, height int) *tab {
	exe := chromium(t)
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(exe), chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.WindowSize(width, height),
	)
	actx, cancel := chromedp.NewExecAllocator(t.Context(), opts...)
	t.Cleanup(cancel)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(cancel)
	ctx, cancel = context.WithTimeout(ctx, 90*time.Second)
	t.Cleanup(cancel)
	b := &tab{t, ctx}
	b.do(chromedp.EmulateViewport(int64(width), int64(height)))
	return b
}

func (b *tab) do(actions ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	require.NoError(b.t, chromedp.Do(b.ctx, actions...))
}

func (b *tab) eval(js string) any {
	b.t.Helper()
	v, err := chromedp.Run(b.ctx, chromedp.Evaluate[any](js))
	require.NoError(b.t, err, js)
	return v
}

func (b *tab) text(sel string) string {
	b.t.Helper()
	s, err := chromedp.Run(b.ctx, chromedp.Text(chromedp.CSS(sel)))
	require.NoError(b.t, err, sel)
	return strings.Join(strings.Fields(s), " ")
}

// open loads a page and waits for an element of it.
func (b *tab) open(url, sel string) {
	b.t.Helper()
	b.do(chromedp.Navigate(url), chromedp.WaitVisible(chromedp.CSS(sel)))
}

// click follows a link or submits a form and waits for the page after,
// which must answer code.
func (b *tab) click(sel string, code int) {
	b.t.Helper()
	resp, err := chromedp.RunResponse(b.ctx, chromedp.Click(chromedp.CSS(sel)))
	require.NoError(b.t, err, sel)
	require.EqualValues(b.t, code, resp.Status, sel)
}

// poll waits, up to a deadline, until a script's value is true.
func (b *tab) poll(js, msg string) {
	b.t.Helper()
	_, err := chromedp.Run(b.ctx, chromedp.Poll[chromedp.Void](js, chromedp.WithPollingTimeout(15*time.Second)))
	require.NoError(b.t, err, msg)
}

// phone makes the tab a phone's screen: 390 CSS pixels wide, the page's
// viewport meta applied, drawn at twice that for the screenshot.
func (b *tab) phone() {
	b.do(chromedp.EmulateViewport(390, 844, chromedp.EmulateMobile, chromedp.EmulateScale(2), chromedp.EmulatePortrait))
}

// scheme emulates the system's colour scheme: "dark" or "light".
func (b *tab) scheme(s string) {
	b.do(chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		_, err := cdp.Call(ctx, t, emulation.SetEmulatedMedia, emulation.SetEmulatedMediaParams{
			Features: []*emulation.MediaFeature{{Name: "prefers-color-scheme", Value: s}},
		})
		return err
	}))
}

// screenshots is where OUTBOXUI_SCREENSHOTS=1 writes the pictures of the
// README and docs/operating.md: outside this module, so that its zip
// (what `go get` downloads) leaves them out.
const screenshots = "../docs/images/outboxui"

// shot takes a screenshot of the whole page. With OUTBOXUI_SCREENSHOTS=1 it
// rewrites docs/images/outboxui/<name>, the README's; otherwise it goes to
// a temporary directory, so that a test run never changes the repository.
func (b *tab) shot(name string) {
	b.t.Helper()
	png, err := chromedp.Run(b.ctx, chromedp.FullScreenshot(100))
	require.NoError(b.t, err)
	require.True(b.t, bytes.HasPrefix(png, []byte("\x89PNG")), "a PNG")
	out := filepath.Join(b.t.TempDir(), name)
	if os.Getenv("OUTBOXUI_SCREENSHOTS") == "1" {
		require.NoError(b.t, os.MkdirAll(screenshots, 0o755))
		out = filepath.Join(screenshots, name)
	}
	require.NoError(b.t, os.WriteFile(out, png, 0o644))
	b.t.Logf("screenshot %s (%d bytes)", out, len(png))
}

// fitsWidth asserts that the page itself does not scroll sideways in a
// window of width CSS pixels: document.documentElement.scrollWidth <=
// innerWidth, and innerWidth is still width (a phone's browser widens its
// layout viewport to a page too wide for it, which would hide the
// overflow).
func (b *tab) fitsWidth(page string, width int) {
	b.t.Helper()
	got := b.eval(`JSON.stringify([document.documentElement.scrollWidth, window.innerWidth])`).(string)
	var w [2]int
	require.NoError(b.t, json.Unmarshal([]byte(got), &w))
	assert.Equal(b.t, width, w[1], "%s: the window is %d px wide, not %d: the page made the browser zoom out", page, w[1], width)
	assert.LessOrEqual(b.t, w[0], w[1], "%s: the page is %d px wide in a %d px window: it scrolls sideways", page, w[0], w[1])
	if w[0] > width {
		// Name the elements that stick out, to fix them.
		b.t.Log(b.eval(`Array.from(document.querySelectorAll("body *")).filter(e => e.getBoundingClientRect().right > window.innerWidth + 0.5 && !e.closest(".table-wrap, pre, h1.event-id")).slice(0, 8).map(e => e.tagName + "." + e.className + "#" + e.id + " " + Math.round(e.getBoundingClientRect().right)).join("; ")`))
	}
}

// a11y checks what every page must have: a skip link to the content that
// comes first, a label for every control, headers with a scope for every
// table, and no live region around the whole page.
func (b *tab) a11y(page string) {
	b.t.Helper()
	assert.Equal(b.t, "A#content", b.eval(`(() => { const a = document.querySelector("body > a"); return a.tagName + a.getAttribute("href") })()`),
		"%s: the first element is the skip link to the content", page)
	assert.Equal(b.t, "[]", b.eval(`JSON.stringify(Array.from(document.querySelectorAll("input:not([type=hidden]), select, textarea"))
		.filter(e => !(e.labels && e.labels.length && e.labels[0].textContent.trim()) && !e.getAttribute("aria-label")).map(e => e.outerHTML))`),
		"%s: every control has a label", page)
	assert.Equal(b.t, "[]", b.eval(`JSON.stringify(Array.from(document.querySelectorAll("th"))
		.filter(th => th.getAttribute("scope") !== (th.closest("thead") ? "col" : "row")).map(th => th.outerHTML))`),
		"%s: every header cell says what it heads", page)
	assert.Equal(b.t, "[]", b.eval(`JSON.stringify(Array.from(document.querySelectorAll("[aria-live]:not([aria-live=off])"))
		.filter(e => e.contains(document.querySelector("main table, main form"))).map(e => e.tagName + "#" + e.id))`),
		"%s: no live region holds the page's tables or forms", page)
}

// TestBrowserLayout opens the list, an event and a confirmation at 1280
// px and on a phone (390 px: the page never scrolls sideways, a table
// scrolls inside its own box), in the light and the dark theme (the
// system's choice, emulated), and checks what the pages owe a keyboard and
// a screen reader. With OUTBOXUI_SCREENSHOTS=1 it rewrites the README's
// screenshots.
func TestBrowserLayout(t *testing.T) {
	e := setup(t, backends(t)[0], outboxui.Options{AllowActions: true, ShowPayloads: true, Title: "Outbox · orders-service"})
	seedRealistic(e)
	b := newTab(t, 1280, 900)

	// 1280 px, light.
	b.open(e.base+"events", "table.rows")
	b.fitsWidth("the list at 1280 px", 1280)
	b.a11y("the list")
	assert.Equal(t, "polite", b.eval(`document.querySelector("#live-summary").getAttribute("aria-live")`), "the summary is announced when it changes")
	light := b.eval(`getComputedStyle(document.body).backgroundColor + " " + getComputedStyle(document.body).color`)
	b.shot("list.png")
	b.open(e.base+"event?id=pay-1003", "#status")
	b.fitsWidth("an event at 1280 px", 1280)
	b.a11y("an event")
	b.shot("event.png")

	// Dark, as the system asks.
	b.scheme("dark")
	b.open(e.base+"events", "table.rows")
	dark := b.eval(`getComputedStyle(document.body).backgroundColor + " " + getComputedStyle(document.body).color`)
	assert.NotEqual(t, light, dark, "the dark theme has its own background and text colours")
	assert.Equal(t, "rgb(14, 18, 23) rgb(228, 231, 235)", dark, "style.css's dark --bg and --fg")
	assert.Equal(t, "rgb(244, 245, 247) rgb(29, 35, 39)", light, "style.css's light --bg and --fg")
	b.shot("list-dark.png")
	b.scheme("light")

	// A phone.
	b.phone()
	for _, p := range []struct{ url, sel, name string }{
		{"events", "table.rows", "the list"},
		{"events?q=order:1003&status=failed,pending", "table.rows", "a search"},
		{"event?id=pay-1003", "#status", "an event"},
		{"event?id=ship-1001", "#status", "an event of a long aggregate"},
		{"", "h1", "the overview"},
	} {
		b.open(e.base+p.url, p.sel)
		b.fitsWidth(p.name+" at 390 px", 390)
	}
	b.open(e.base+"events", "table.rows")
	assert.Equal(t, true, b.eval(`(() => { const w = document.querySelector("#live-list .table-wrap");
		return getComputedStyle(w).overflowX === "auto" && w.scrollWidth > w.clientWidth })()`),
		"the table is wider than a phone and scrolls inside its own box")
	b.shot("list-phone.png")
	// The confirmation on a phone fits too.
	b.click("#bulk-replay", 200)
	b.fitsWidth("a confirmation at 390 px", 390)
	b.a11y("a confirmation")
}

// TestBrowserKeyboard works the list with the keyboard only: the skip
// link comes first and moves to the content, Tab reaches the search box
// and then the action buttons in the order they read, the focus is drawn,
// and a row ticked with Space is replayed through the confirmation with
// Enter.
func TestBrowserKeyboard(t *testing.T) {
	e := setup(t, backends(t)[0], outboxui.Options{AllowActions: true, Refresh: -1})
	seedRealistic(e)
	b := newTab(t, 1280, 900)
	b.open(e.base+"events", "table.rows")

	// Tab from the top of the page, noting where the focus goes.
	var order []string
	for range 40 {
		b.do(chromedp.KeyEvent(kb.Tab))
		order = append(order, b.eval(`(() => { const a = document.activeElement; return a.id || a.tagName + ":" + a.textContent.trim().slice(0, 20) })()`).(string))
	}
	t.Logf("tab order: %s", strings.Join(order, " | "))
	assert.Equal(t, "A:Skip to the content", order[0], "the skip link first")
	at := func(id string) int {
		i := slices.Index(order, id)
		assert.GreaterOrEqual(t, i, 0, "Tab never reaches #%s: %v", id, order)
		return i
	}
	seq := []string{"f-q", "f-status-pending", "f-apply", "pick-replay", "pick-purge", "bulk-replay", "bulk-purge"}
	for i := 1; i < len(seq); i++ {
		assert.Less(t, at(seq[i-1]), at(seq[i]), "#%s comes before #%s", seq[i-1], seq[i])
	}

	// The focus is drawn: the ring of :focus-visible.
	b.do(chromedp.Navigate(e.base+"events"), chromedp.WaitVisible(chromedp.CSS("#f-q")))
	for range slices.Index(order, "f-q") + 1 {
		b.do(chromedp.KeyEvent(kb.Tab))
	}
	assert.Equal(t, "f-q", b.eval(`document.activeElement.id`))
	assert.Equal(t, "solid 3px", b.eval(`(() => { const s = getComputedStyle(document.activeElement); return s.outlineStyle + " " + s.outlineWidth })()`),
		"the search box shows the focus ring")

	// The skip link moves the focus to the content.
	b.do(chromedp.Navigate(e.base+"events"), chromedp.WaitVisible(chromedp.CSS("#f-q")), chromedp.KeyEvent(kb.Tab))
	assert.Equal(t, "solid 3px", b.eval(`(() => { const s = getComputedStyle(document.activeElement); return s.outlineStyle + " " + s.outlineWidth })()`),
		"the skip link shows when focused")
	b.do(chromedp.KeyEvent(kb.Enter))
	b.poll(`document.activeElement.id === "content"`, "Enter on the skip link focuses the content")

	// Tick a row with Space, replay it with Enter, confirm with Enter.
	b.do(chromedp.Focus(chromedp.CSS(`input[form=pick][value="pay-1005"]`)), chromedp.KeyEvent(" "))
	assert.Equal(t, true, b.eval(`document.querySelector('input[form=pick][value="pay-1005"]').checked`), "Space ticks the row")
	b.do(chromedp.Focus(chromedp.CSS("#pick-replay")), chromedp.KeyEvent(kb.Enter), chromedp.WaitVisible(chromedp.CSS("#confirm-scope")))
	assert.Equal(t, "Replay 1 failed event of the 1 selected?", b.text("#confirm-scope"))
	b.do(chromedp.Focus(chromedp.CSS("#confirm")), chromedp.KeyEvent(kb.Enter), chromedp.WaitVisible(chromedp.CSS("#flash")))
	assert.Regexp(t, `^Replayed 1 event by 127\.0\.0\.1:\d+: pending again, due now\.$`, b.text("#flash"))
	assert.Equal(t, outbox.StatusPending, e.row("pay-1005").Status)
	assert.Equal(t, outbox.StatusFailed, e.row("pay-1003").Status, "only the ticked one")
}

// TestBrowserReplayByFilter replays everything a filter matches, end to
// end: the list's button, the confirmation saying how many of which
// status and the filter, its button, and the list again with the rows
// pending. With OUTBOXUI_SCREENSHOTS=1 it rewrites
// docs/images/outboxui/confirm.png.
func TestBrowserReplayByFilter(t *testing.T) {
	e := setup(t, backends(t)[0], outboxui.Options{AllowActions: true, Title: "Outbox · orders-service",
		Identity: func(*http.Request) string { return "alice@example.com" }})
	seedRealistic(e)
	b := newTab(t, 1280, 900)
	statuses := func() string {
		return b.eval(`Array.from(document.querySelectorAll("table.rows tbody .status")).map(s => s.textContent).join(",")`).(string)
	}
	b.open(e.base+"events?type=payment.captured", "table.rows")
	assert.Equal(t, "failed,failed", statuses())
	assert.Equal(t, "Replay 2 failed events where type is payment.captured…", b.text("#bulk-replay"))

	b.click("#bulk-replay", 200)
	assert.Equal(t, "Replay 2 failed events where type is payment.captured?", b.text("#confirm-scope"))
	assert.Equal(t, "2 failed events where type is payment.captured will be set pending and due now, with their attempts reset: the relay delivers them again.",
		b.text("#confirm-what"))
	assert.Equal(t, "failed 2 set pending, due now, attempts reset", b.text("#tally-failed"))
	assert.Equal(t, "status failed type payment.captured", b.text("#confirm-filter"))
	b.fitsWidth("the confirmation", 1280)
	b.shot("confirm.png")
	assert.Equal(t, outbox.StatusFailed, e.row("pay-1003").Status, "nothing done before the confirmation")

	b.click("#confirm", 200)
	loc, err := chromedp.Run(b.ctx, chromedp.Location())
	require.NoError(t, err)
	assert.True(t, strings.HasSuffix(loc, "/ops/outbox/events?type=payment.captured"), "back to the list: %s", loc)
	assert.Equal(t, "Replayed 2 events by alice@example.com: pending again, due now.", b.text("#flash"))
	assert.Equal(t, "pending,pending", statuses(), "the rows are pending in the table")
	assert.Equal(t, outbox.StatusPending, e.row("pay-1003").Status)
	assert.Equal(t, outbox.StatusPending, e.row("pay-1005").Status)
	assert.Equal(t, outbox.StatusFailed, e.row("mail-1004").Status, "another type's failure stays")
}

// TestBrowserLiveHeld ticks a row while the list refreshes in place: the
// summary keeps updating (in place, in the same aria-live element), the
// rows are held with the tick until it is unticked, then the new row
// arrives.
func TestBrowserLiveHeld(t *testing.T) {
	e := setup(t, backends(t)[0], outboxui.Options{AllowActions: true, Refresh: 200 * time.Millisecond})
	seedRealistic(e)
	b := newTab(t, 1280, 900)
	b.open(e.base+"events?type=order.created", "table.rows")
	b.poll(`/updated \d+s ago/.test(document.querySelector("#updated").textContent)`, "live.js runs")
	b.eval(`document.querySelector("#live-summary").dataset.same = "1"; document.querySelector('input[form=pick][value="ord-1002"]').click()`)
	b.do(chromedp.Focus(chromedp.CSS("#f-q"))) // the focus out of the rows
	e.publish(outbox.Event{ID: "ord-live", Type: "order.created"})
	b.poll(`document.querySelector("#total").textContent === "8"`, "the new count arrives")
	assert.Equal(t, "1", b.eval(`document.querySelector("#live-summary").dataset.same`), "in the same live region element")
	assert.Equal(t, true, b.eval(`document.querySelector('input[form=pick][value="ord-1002"]').checked`), "the tick is kept")
	assert.Equal(t, false, b.eval(`!!document.querySelector('a[href="event?id=ord-live"]')`), "the rows are held")
	b.poll(`/held while events are ticked/.test(document.querySelector("#updated").textContent)`, "the page says why")
	b.eval(`document.querySelector('input[form=pick][value="ord-1002"]').click()`)
	b.do(chromedp.Focus(chromedp.CSS("#f-q")))
	b.poll(`!!document.querySelector('a[href="event?id=ord-live"]')`, "unticked, the rows refresh")
}
