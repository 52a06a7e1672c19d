package outboxui_test

import (
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/outboxui"
)

// TestOnCall runs the tests of what the on-call engineer needs beyond
// replay and purge (retry now, next attempt, the relays, the warning,
// errors on one line) on every database, as TestDashboard does.
func TestOnCall(t *testing.T) {
	tests := map[string]func(*testing.T, backend){
		"RetryOneFromItsPage":      testRetryOne,
		"RetryByFilter":            testRetryByFilter,
		"RetrySelection":           testRetrySelection,
		"RetryFewerRunsMoreAsks":   testRetryCounts,
		"RetrySkipsLeased":         testRetryLeased,
		"RetryReadOnly":            testRetryReadOnly,
		"WarningNoRelay":           testWarningNoRelay,
		"WarningBehindAndRelays":   testWarningBehind,
		"ErrorsOnOneLineWithoutID": testErrorCells,
		"PayloadsHint":             testPayloadsHint,
		"RelaysEscaped":            testRelaysEscaped,
	}
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			for name, fn := range tests {
				t.Run(name, func(t *testing.T) {
					t.Parallel()
					fn(t, b)
				})
			}
		})
	}
}

// seedBackoff writes three events that failed once and wait 10 minutes
// for their retry (wait-1 and wait-2 of type retries.a, wait-3 of
// retries.b), then seed's: two sent, two failed, two pending and due.
func seedBackoff(e *env) {
	e.publish(
		outbox.Event{ID: "wait-1", Type: "retries.a", AggregateType: "order", AggregateID: "5"},
		outbox.Event{ID: "wait-2", Type: "retries.a"},
		outbox.Event{ID: "wait-3", Type: "retries.b"},
	)
	seed(e) // its first drain attempts them
	for _, id := range []string{"wait-1", "wait-2", "wait-3"} {
		r := e.row(id)
		require.Equal(e.t, outbox.StatusPending, r.Status, id)
		require.Equal(e.t, 1, r.Attempts, id)
		require.True(e.t, r.AvailableAt.After(time.Now().Add(backoff-time.Minute)), "%s waits for its retry: %s", id, r.AvailableAt)
	}
}

// waitingNow tells whether the event waits for a retry now, as the table
// says.
func (e *env) waitingNow(id string) bool {
	return e.row(id).AvailableAt.After(time.Now())
}

// clock is how a list cell shows a next attempt's time.
func clock(at time.Time) string {
	at = at.UTC()
	if at.Format("2006-01-02") != time.Now().UTC().Format("2006-01-02") {
		return at.Format("Jan 2 15:04:05")
	}
	return at.Format("15:04:05")
}

// rowOf is the list's table row of the event id.
func rowOf(body, id string) string {
	return between(body, `<a href="event?id=`+url.QueryEscape(id)+`">`, `</tr>`)
}

func testRetryOne(t *testing.T, b backend) {
	e := setup(t, b, outboxui.Options{AllowActions: true, Identity: func(*http.Request) string { return "alice@example.com" }})
	seedBackoff(e)
	r := e.row("wait-1")

	// The list says when each pending event in backoff is next attempted.
	_, list := e.get("events")
	assert.Contains(t, rowOf(list, "wait-1"), `next attempt `+clock(r.AvailableAt)+`</span>`)
	assert.Contains(t, rowOf(list, "wait-1"), `title="next attempt at `+r.AvailableAt.UTC().Format("2006-01-02 15:04:05.000")+` UTC, in 9m`)
	for _, id := range []string{"new-1", "ok-1", "bad-1"} {
		assert.NotContains(t, rowOf(list, id), "next attempt", "%s waits for no retry", id)
	}

	// Its page too, with Retry now above the fold: before the error, the
	// history and the payload.
	_, body := e.get("event?id=wait-1")
	assert.Contains(t, body, `<span id="next-attempt">next attempt at `+r.AvailableAt.UTC().Format("2006-01-02 15:04:05.000")+` UTC (in 9m`)
	assert.Contains(t, body, `(the next attempt)`, "beside available_at")
	require.Contains(t, body, `id="retry"`)
	assert.NotContains(t, body, `id="replay"`, "a pending event is not replayed")
	assert.NotContains(t, body, `id="purge"`, "nor purged")
	at := func(s string) int {
		i := strings.Index(body, s)
		require.GreaterOrEqual(t, i, 0, s)
		return i
	}
	assert.Less(t, at(`id="actions"`), at(`id="last-error-heading"`), "the actions come before the error")
	assert.Less(t, at(`id="last-error-heading"`), at(`id="history-heading"`))
	assert.Less(t, at(`id="history-heading"`), at(`<h2>Payload</h2>`))
	_, failed := e.get("event?id=bad-1")
	assert.Less(t, strings.Index(failed, `id="replay"`), strings.Index(failed, `id="last-error-heading"`), "Replay too")
	assert.NotContains(t, failed, `id="retry"`, "a failed event waits for no retry")
	_, due := e.get("event?id=new-1")
	assert.NotContains(t, due, `id="retry"`, "nor does a pending event already due")
	assert.NotContains(t, due, `id="next-attempt"`)

	// Pressed: due now, its attempts kept, the history says who.
	resp := e.post("retry", submitted(t, body, `action="retry"`))
	require.Equal(t, http.StatusSeeOther, resp.StatusCode, readBody(t, resp))
	assert.Equal(t, "event?id=wait-1", resp.Header.Get("Location"))
	got := e.row("wait-1")
	assert.Equal(t, outbox.StatusPending, got.Status)
	assert.Equal(t, 1, got.Attempts, "attempts kept")
	assert.False(t, got.AvailableAt.After(time.Now()), "due now: %s", got.AvailableAt)
	assert.True(t, e.waitingNow("wait-2"), "only the event asked for")
	hist, err := e.ob.History(e.db.WithContext(t.Context()), "wait-1")
	require.NoError(t, err)
	require.NotEmpty(t, hist)
	assert.Equal(t, outbox.OutcomeRetried, hist[len(hist)-1].Outcome)
	assert.Equal(t, "alice@example.com", hist[len(hist)-1].Actor)
	_, page := e.follow(resp)
	assert.Contains(t, page, `id="flash">Retried 1 event now by alice@example.com: due now, attempts kept.</p>`)
	assert.Contains(t, page, `<td>retried now</td>`, "the history shows the retry")
	assert.Contains(t, page, `<td>alice@example.com</td>`)
	assert.NotContains(t, page, `id="retry"`, "due now: nothing more to retry")

	// The same button again has nothing to do: it asks, and does nothing.
	resp = e.post("retry", submitted(t, body, `action="retry"`))
	again := readBody(t, resp)
	assert.Equal(t, http.StatusConflict, resp.StatusCode, again)
	assert.Contains(t, again, `id="confirm-nothing">Nothing to do.<`)

	// The relay attempts it at once, and with its receiver fixed delivers it.
	setText(&e.retryWith, "")
	e.drain()
	assert.Equal(t, outbox.StatusSent, e.row("wait-1").Status)
	assert.Equal(t, outbox.StatusPending, e.row("wait-2").Status, "still waiting for its own retry")
}

func testRetryByFilter(t *testing.T, b backend) {
	logs := &syncBuffer{}
	e := setup(t, b, outboxui.Options{AllowActions: true, Logger: slog.New(slog.NewTextHandler(logs, nil))})
	seedBackoff(e)
	type want struct{ text, why string }
	for _, c := range []struct {
		query string
		retry want
	}{
		{"", want{"Retry now 3 pending events waiting for a retry…", ""}},
		{"status=pending,failed", want{"Retry now 3 pending events waiting for a retry…", ""}},
		{"type=retries.a", want{"Retry now 2 pending events waiting for a retry where type is retries.a…", ""}},
		{"status=failed", want{"Retry now", "retry now touches only pending events; this filter asks for failed"}},
		{"status=sent,failed", want{"Retry now", "retry now touches only pending events; this filter asks for sent, failed"}},
		{"type=order.created", want{"Retry now 0 pending events waiting for a retry where type is order.created",
			"no pending event waiting for a retry matches this filter: 2 pending, due already or being delivered"}},
	} {
		code, body := e.get("events?" + c.query)
		require.Equal(t, http.StatusOK, code, "%s: %s", c.query, body)
		text, disabled, why := bulkButton(t, body, "retry")
		assert.Equal(t, c.retry.text, text, c.query)
		assert.Equal(t, c.retry.why != "", disabled, c.query)
		assert.Equal(t, c.retry.why, why, c.query)
	}
	// The pick form offers it between replay and purge.
	_, body := e.get("events")
	assert.Contains(t, body, `<button type="submit" id="pick-retry" formaction="retry">Retry ticked now…</button>`)

	// Under a filter that also asks for failed events: the confirmation
	// says what it leaves alone, and why.
	_, body = e.get("events?status=pending,failed")
	resp := e.post("retry", submitted(t, body, `id="bulk-retry-form"`))
	confirm := readBody(t, resp)
	require.Equal(t, http.StatusOK, resp.StatusCode, confirm)
	assert.Equal(t, map[string]string{
		"waiting": "3: made due now, attempts kept",
		"due":     "2: left alone: nothing to retry",
		"failed":  "2: left alone: only pending events wait for a retry",
	}, tallyOf(t, confirm))
	assert.Equal(t, "The filter also asks for failed events: only pending events wait for a retry, so they are left alone.",
		textOf(between(confirm, `<p class="note" id="confirm-left">`, `</p>`)))
	assert.Equal(t, []string{"status: pending, waiting for a retry"}, facts(confirm))

	// By type: the button, its confirmation, the action.
	_, body = e.get("events?type=retries.a")
	resp = e.post("retry", submitted(t, body, `id="bulk-retry-form"`))
	confirm = readBody(t, resp)
	require.Equal(t, http.StatusOK, resp.StatusCode, confirm)
	assert.Equal(t, "Retry now 2 pending events waiting for a retry where type is retries.a?", textOf(between(confirm, `<h1 id="confirm-scope">`, `</h1>`)))
	assert.Equal(t, "2 pending events where type is retries.a, waiting for a retry, will be made due now, their attempts kept "+
		"(MaxAttempts still counts them): the relay attempts them at once instead of after the wait.", confirmWhat(confirm))
	assert.Equal(t, []string{"wait-1", "wait-2"}, ids(between(confirm, `<table class="rows">`, `</table>`)), "the events it makes due")
	assert.Equal(t, []string{"waiting:2"}, submitted(t, confirm, `class="confirm"`)["expect"])
	assert.True(t, e.waitingNow("wait-1"), "nothing done before the confirmation")
	resp = e.post("retry", submitted(t, confirm, `class="confirm"`))
	require.Equal(t, http.StatusSeeOther, resp.StatusCode, readBody(t, resp))
	assert.Equal(t, "events?type=retries.a", resp.Header.Get("Location"))
	assert.False(t, e.waitingNow("wait-1"))
	assert.False(t, e.waitingNow("wait-2"))
	assert.True(t, e.waitingNow("wait-3"), "another type's stays")
	_, page := e.follow(resp)
	assert.Contains(t, page, `>Retried 2 events now by 127.0.0.1:`)
	assert.Regexp(t, `msg="outboxui: retry" who=127\.0\.0\.1:\d+ action=retry scope=filter filter="type=retries.a" events=2 remote_addr=`, logs.String())
	text, disabled, _ := bulkButton(t, page, "retry")
	assert.True(t, disabled, "nothing more to retry there: %s", text)
}

func testRetrySelection(t *testing.T, b backend) {
	e := setup(t, b, outboxui.Options{AllowActions: true})
	seedBackoff(e)
	_, list := e.get("events?limit=20")
	form := pickForm(t, list, "wait-3", "new-1", "bad-1")
	form.Add("id", "gone")
	resp := e.post("retry", form)
	body := readBody(t, resp)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	assert.Equal(t, "Retry now 1 pending event waiting for a retry of the 4 selected?", textOf(between(body, `<h1 id="confirm-scope">`, `</h1>`)))
	assert.Equal(t, map[string]string{
		"waiting": "1: made due now, attempts kept",
		"due":     "1: left alone: nothing to retry",
		"failed":  "1: left alone: only pending events wait for a retry",
		"gone":    "1: nothing: purged, or never written",
	}, tallyOf(t, body))
	assert.Equal(t, []string{"selected: 4 events ticked on the list", "IDs: bad-1, gone, new-1, wait-3",
		"status: pending (those retry now touches)"}, facts(body))
	resp = e.post("retry", submitted(t, body, `class="confirm"`))
	require.Equal(t, http.StatusSeeOther, resp.StatusCode, readBody(t, resp))
	assert.Equal(t, "events?limit=20", resp.Header.Get("Location"))
	assert.False(t, e.waitingNow("wait-3"))
	assert.True(t, e.waitingNow("wait-1"), "not ticked")
	assert.Equal(t, outbox.StatusFailed, e.row("bad-1").Status)
}

// testRetryCounts: a retry runs when fewer events wait than the
// confirmation showed (the others became due, or were delivered: what a
// retry is for), asks again when more do (another failed since), and
// changes nothing then.
func testRetryCounts(t *testing.T, b backend) {
	e := setup(t, b, outboxui.Options{AllowActions: true})
	seedBackoff(e)
	_, body := e.get("events?type=retries.a")
	resp := e.post("retry", submitted(t, body, `id="bulk-retry-form"`))
	confirm := readBody(t, resp)
	require.Equal(t, http.StatusOK, resp.StatusCode, confirm)
	button := submitted(t, confirm, `class="confirm"`)
	require.Equal(t, []string{"waiting:2"}, button["expect"])

	// More wait now: asked again, nothing done.
	e.publish(outbox.Event{ID: "wait-4", Type: "retries.a"})
	e.drain()
	resp = e.post("retry", button)
	again := readBody(t, resp)
	require.Equal(t, http.StatusConflict, resp.StatusCode, again)
	assert.Contains(t, textOf(again), "it counted 2 waiting for a retry, now 3 waiting for a retry. Nothing was done")
	for _, id := range []string{"wait-1", "wait-2", "wait-4"} {
		assert.True(t, e.waitingNow(id), "%s: nothing done", id)
	}
	// Fewer: one was made due meanwhile (another operator); the rest go.
	n, err := e.ob.RetryNow(e.db.WithContext(t.Context()), outbox.Filter{IDs: []string{"wait-1", "wait-4"}})
	require.NoError(t, err)
	require.Equal(t, 2, n)
	resp = e.post("retry", button)
	require.Equal(t, http.StatusSeeOther, resp.StatusCode, readBody(t, resp))
	_, page := e.follow(resp)
	assert.Contains(t, page, `>Retried 1 event now by `)
	assert.False(t, e.waitingNow("wait-2"))
}

// testRetryLeased: an event a relay holds (its lease running) is being
// delivered: Retry now leaves it, as the core does, and the pages say it
// waits for no retry.
func testRetryLeased(t *testing.T, b backend) {
	e := setup(t, b, outboxui.Options{AllowActions: true})
	seedBackoff(e)
	res := e.db.Exec("UPDATE "+e.ob.Table()+" SET locked_until = ? WHERE named_id = ?", e.b.timeArg(time.Now().Add(time.Hour)), "wait-2")
	require.NoError(t, res.Error)
	require.EqualValues(t, 1, res.RowsAffected)
	_, body := e.get("events?type=retries.a")
	text, _, _ := bulkButton(t, body, "retry")
	assert.Equal(t, "Retry now 1 pending event waiting for a retry where type is retries.a…", text)
	assert.NotContains(t, rowOf(body, "wait-2"), "next attempt")
	_, page := e.get("event?id=wait-2")
	assert.NotContains(t, page, `id="retry"`)
}

func testRetryReadOnly(t *testing.T, b backend) {
	e := setup(t, b, outboxui.Options{})
	seedBackoff(e)
	_, body := e.get("event?id=wait-1")
	assert.Contains(t, body, `id="next-attempt"`, "read-only pages say when too")
	assert.NotContains(t, body, `id="retry"`)
	resp := e.post("retry", url.Values{"id": {"wait-1"}, "confirm": {"yes"}, "expect": {"waiting:1"}})
	assert.Equal(t, http.StatusForbidden, resp.StatusCode)
	assert.True(t, e.waitingNow("wait-1"))
	// With actions, the form token is still needed.
	a := setup(t, b, outboxui.Options{AllowActions: true})
	seedBackoff(a)
	resp = a.post("retry", url.Values{"id": {"wait-1"}, "confirm": {"yes"}, "expect": {"waiting:1"}})
	assert.Equal(t, http.StatusForbidden, resp.StatusCode)
	assert.Contains(t, readBody(t, resp), "form token")
	assert.True(t, a.waitingNow("wait-1"))
}

func testWarningNoRelay(t *testing.T, b backend) {
	e := setup(t, b, outboxui.Options{})
	// Nothing pending, no relay: calm.
	for _, page := range []string{"", "events"} {
		_, body := e.get(page)
		assert.Contains(t, body, `<div id="live-warning" data-live>`, "%q: the region is there, for the refresh", page)
		assert.NotContains(t, body, `class="warning"`, "%q: nothing waits: no warning", page)
	}
	_, body := e.get("")
	assert.Contains(t, body, `<p id="no-relays">No relay has recorded itself in the last 15 s, nor ever.</p>`)

	seed(e) // two pending, and no relay runs (drain is no relay's Run)
	for _, page := range []string{"", "events", "events?status=failed"} {
		_, body := e.get(page)
		warning := between(body, `<section class="warning" role="alert"`, `</section>`)
		require.NotEmpty(t, warning, "%q: a warning", page)
		assert.Contains(t, textOf(warning), "No relay is running 2 events are pending and nothing delivers them: "+
			"no relay of this table has recorded itself in the last 15 s (none ever has).", page)
		assert.NotContains(t, warning, `id="warning-behind"`, "%q: new events are not behind", page)
		// At the top: before the page's own content.
		first := `<nav class="windows"`
		if page != "" {
			first = `<form class="filter"`
		}
		assert.Less(t, strings.Index(body, warning), strings.Index(body, first), "%q: at the top", page)
	}
	_, frag := e.get("events?live=1")
	assert.Contains(t, frag, `id="warning-no-relay"`, "the warning refreshes in place")
}

func testWarningBehind(t *testing.T, b backend) {
	host, err := os.Hostname()
	require.NoError(t, err)
	e := setup(t, b, outboxui.Options{})
	e.runRelay("relay-a")
	_, body := e.get("")
	assert.NotContains(t, body, `class="warning"`, "a relay runs, nothing waits")
	relays := between(body, `<table class="relays" id="relays">`, `</table>`)
	require.NotEmpty(t, relays, "the relays panel: %s", body)
	assert.Contains(t, relays, `<th scope="row">relay-a</th><td>`+host+`</td><td class="num">`+itoa(os.Getpid())+`</td><td>persistent</td>`)
	assert.Contains(t, body, `<p class="note" id="relays-note">1 running:`)

	// A relay that delivers; an event in backoff, created 10 minutes ago:
	// past the 5 minutes of the default MaxPendingAge.
	e.publish(outbox.Event{ID: "ok-9", Type: "order.created"}, outbox.Event{ID: "wait-9", Type: "retries.x"}, outbox.Event{ID: "down-9", Type: "down.mail"})
	e.waitStats(func(st outbox.Stats) bool {
		return len(st.Relays) == 1 && !st.Relays[0].LastDelivery.IsZero() && st.Relays[0].LastError != ""
	}, "the relay delivered, and recorded the destination down")
	setText(&e.downWith, "")
	e.waitStats(func(st outbox.Stats) bool { return st.Pending == 1 }, "down-9 delivered once the destination is back")
	e.backdate("wait-9", time.Now().Add(-10*time.Minute))
	created := e.row("wait-9").CreatedAt.UTC().Truncate(time.Second)
	for _, page := range []string{"", "events"} {
		_, body = e.get(page)
		warning := between(body, `<section class="warning" role="alert"`, `</section>`)
		require.NotEmpty(t, warning, "%q: a warning", page)
		assert.NotContains(t, warning, "warning-no-relay", "%q: a relay runs", page)
		text := textOf(warning)
		assert.Contains(t, text, "Delivery is behind The oldest pending event was created at ", page)
		assert.Contains(t, text, "more than 5m ago, though 1 relay is running: delivery is stuck or behind.", page)
		if page == "" {
			assert.Contains(t, text, "and the relays' last errors below.")
		} else {
			assert.Contains(t, warning, `and the relays' last errors on <a href="./#relays-heading">the overview</a>.`)
		}
		// The time it says is the event's, to the second (give or take the
		// second the page and Stats were read in).
		i := strings.Index(text, "created at ")
		got, err := time.Parse("2006-01-02 15:04:05", text[i+len("created at "):i+len("created at ")+19])
		require.NoError(t, err, text)
		assert.WithinDuration(t, created, got, 2*time.Second, text)
	}
	_, body = e.get("")
	relays = between(body, `<table class="relays" id="relays">`, `</table>`)
	assert.Regexp(t, `<td>persistent</td><td class="time" title="started \d+s ago">\d{4}-\d\d-\d\d \d\d:\d\d:\d\d</td>`+
		`<td class="time" title="[0-9-]+ [0-9:.]+ UTC">\d+s ago</td><td class="time" title="[0-9-]+ [0-9:.]+ UTC">\d+s ago</td>`, relays,
		"up since, last claim and last delivery")
	assert.Contains(t, body, `id="last-delivery">`+time.Now().UTC().Format("2006-01-02"), "the last delivery, on the overview")

	// The threshold is an option; negative turns that warning off.
	for _, c := range []struct {
		age  time.Duration
		warn bool
	}{{20 * time.Minute, false}, {-1, false}, {time.Minute, true}} {
		srv := setupShared(t, e, outboxui.Options{MaxPendingAge: c.age})
		_, body := srv.get("")
		assert.Equal(t, c.warn, strings.Contains(body, `id="warning-behind"`), "MaxPendingAge %s", c.age)
	}
}

// testErrorCells: a last error is one line in the list, cut by the
// stylesheet, the whole text its title, without the event's own ID (which
// errors written before the cause came first held); the history does not
// repeat the ID either.
func testErrorCells(t *testing.T, b backend) {
	e := setup(t, b, outboxui.Options{})
	id := "0193a4c2-7f3e-7b1a-9c2d-5e6f7a8b9c0d"
	cause := "outbox/webhook: deliver event " + id + " to hooks.example.com: 410 Gone\nthe endpoint was removed"
	old := cause + " (permanent)" // as outbox.Permanent writes it
	e.publish(outbox.Event{ID: id, Type: "fails.hook"})
	e.failWith = cause
	e.drain()
	_, list := e.get("events")
	cell := between(rowOf(list, id), `<td class="err">`, `</td>`)
	assert.Equal(t, `<td class="err"><span class="cut" title="`+old+`">`+
		`outbox/webhook: deliver this event to hooks.example.com: 410 Gone the endpoint was removed (permanent)</span></td>`, cell)
	_, page := e.get("event?id=" + id)
	assert.Contains(t, page, `<pre class="err" id="last-error">`+old+`</pre>`, "the event's page has it whole")
	hist := between(page, `<table class="history" id="history">`, `</table>`)
	assert.Contains(t, hist, "deliver this event to hooks.example.com: 410 Gone")
	assert.NotContains(t, hist, id, "the history does not repeat the ID")

	// A cause-first error is shown as it is.
	e.publish(outbox.Event{ID: "new-err", Type: "fails.hook"})
	e.failWith = "410 Gone from hooks.example.com"
	e.drain()
	_, list = e.get("events")
	assert.Contains(t, rowOf(list, "new-err"), `<span class="cut" title="410 Gone from hooks.example.com (permanent)">410 Gone from hooks.example.com (permanent)</span>`)
}

func testPayloadsHint(t *testing.T, b backend) {
	e := setup(t, b, outboxui.Options{})
	e.publish(outbox.Event{ID: "p-1", Type: "x", Payload: map[string]any{"a": 1}})
	_, body := e.get("event?id=p-1")
	assert.Contains(t, body, "bytes, hidden (set outboxui.Options.ShowPayloads to show payloads).")
	srv := setupShared(t, e, outboxui.Options{PayloadsHint: "restart outbox ui with --show-payloads"})
	_, body = srv.get("event?id=p-1")
	assert.Contains(t, body, "bytes, hidden (restart outbox ui with --show-payloads to show payloads).")
}

// testRelaysEscaped: a relay's name and last error are shown as text, in
// the panel and in the error's title.
func testRelaysEscaped(t *testing.T, b backend) {
	e := setup(t, b, outboxui.Options{})
	setText(&e.downWith, `"><script>alert(9)</script>`)
	e.runRelay(`<img src=x onerror=alert(8)>`)
	e.publish(outbox.Event{ID: "down-1", Type: "down.x"})
	e.waitStats(func(st outbox.Stats) bool { return len(st.Relays) == 1 && st.Relays[0].LastError != "" }, "the relay recorded the error")
	_, body := e.get("")
	relays := between(body, `<table class="relays" id="relays">`, `</table>`)
	require.NotEmpty(t, relays)
	assert.NotContains(t, withoutLiveJS(body), "<script")
	assert.NotContains(t, body, "<img")
	assert.Contains(t, relays, `<th scope="row">&lt;img src=x onerror=alert(8)&gt;</th>`)
	assert.Contains(t, relays, `title="&#34;&gt;&lt;script&gt;alert(9)&lt;/script&gt; (destination unavailable); batch handed back undelivered"`)
}
