package outboxui_test

import (
	"log/slog"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/outboxui"
)

// TestActions runs the tests of acting by selection and by filter (the
// confirmation's counts per status, what it runs, asking again when the
// rows moved, who is logged) on every database, as TestDashboard does.
func TestActions(t *testing.T) {
	tests := map[string]func(*testing.T, backend){
		"FilterPreviewCountsByStatus": testFilterPreview,
		"SelectionPreviewAndRun":      testSelection,
		"ChangedAsksAgain":            testChangedAsksAgain,
		"IdentityLogged":              testIdentityLogged,
		"ReadOnlyRefusesEveryScope":   testReadOnlyScopes,
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

// byStatus counts the table's rows per status with SQL of the test's own
// (not the dashboard's Count), where the event type is typ ("" for any).
func (e *env) byStatus(typ string) map[string]int64 {
	e.t.Helper()
	q := "SELECT status, COUNT(*) FROM " + e.ob.Table()
	var args []any
	if typ != "" {
		q += " WHERE event_type = ?"
		args = append(args, typ)
	}
	rows, err := e.db.Raw(q+" GROUP BY status", args...).Rows()
	require.NoError(e.t, err)
	defer rows.Close()
	out := map[string]int64{}
	for rows.Next() {
		var s string
		var n int64
		require.NoError(e.t, rows.Scan(&s, &n))
		out[s] = n
	}
	require.NoError(e.t, rows.Err())
	return out
}

// statuses returns each listed event's status, read from the table.
func (e *env) statuses(ids ...string) map[string]outbox.Status {
	e.t.Helper()
	out := map[string]outbox.Status{}
	for _, id := range ids {
		out[id] = e.row(id).Status
	}
	return out
}

var tallyRE = regexp.MustCompile(`<tr id="tally-(\w+)"[^>]*><th scope="row">.*?</th><td class="num">([\d,]+)</td><td>([^<]*)</td></tr>`)

// tallyOf reads the confirmation's table of counts per status: status →
// "count: what happens".
func tallyOf(t testing.TB, body string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, m := range tallyRE.FindAllStringSubmatch(body, -1) {
		out[m[1]] = m[2] + ": " + textOf(m[3])
	}
	require.NotEmpty(t, out, "no tally on the page: %s", body)
	return out
}

var factRE = regexp.MustCompile(`<dt>([^<]*)</dt><dd>([^<]*)</dd>`)

// facts reads the confirmation's list of the filter in effect: "name: value".
func facts(body string) []string {
	var out []string
	for _, m := range factRE.FindAllStringSubmatch(between(body, `<dl class="facts" id="confirm-filter">`, `</dl>`), -1) {
		out = append(out, textOf(m[1])+": "+textOf(m[2]))
	}
	return out
}

func confirmWhat(body string) string {
	return textOf(between(body, `<p class="what" id="confirm-what">`, `</p>`))
}

func testFilterPreview(t *testing.T, b backend) {
	e := setup(t, b, outboxui.Options{AllowActions: true})
	// The purge: 1,200 sent and 4 failed events of one type, with
	// 3 pending beside them and others of another type.
	var evs []outbox.Event
	for i := range 1200 {
		evs = append(evs, outbox.Event{ID: "s-" + pad(i), Type: "order.created"})
	}
	e.publish(evs...)
	e.publish(outbox.Event{ID: "other-sent", Type: "order.paid"})
	e.drain()
	e.failTypes = map[string]bool{"order.created": true, "order.paid": true}
	e.publish(outbox.Event{ID: "f-1", Type: "order.created"}, outbox.Event{ID: "f-2", Type: "order.created"},
		outbox.Event{ID: "f-3", Type: "order.created"}, outbox.Event{ID: "f-4", Type: "order.created"},
		outbox.Event{ID: "other-failed", Type: "order.paid"})
	e.drain()
	e.publish(outbox.Event{ID: "p-1", Type: "order.created"}, outbox.Event{ID: "p-2", Type: "order.created"},
		outbox.Event{ID: "p-3", Type: "order.created"})
	table := e.byStatus("order.created")
	require.Equal(t, map[string]int64{"sent": 1200, "failed": 4, "pending": 3}, table)

	_, list := e.get("events?type=order.created")
	// Purge by filter: the confirmation's counts are the table's.
	resp := e.post("purge", submitted(t, list, `id="bulk-purge-form"`))
	body := readBody(t, resp)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	assert.Equal(t, map[string]string{
		"sent":    "1,200: deleted",
		"failed":  "4: deleted",
		"pending": "3: left alone: pending events are never purged",
	}, tallyOf(t, body))
	assert.Equal(t, "1,204 events where type is order.created (1,200 sent, 4 failed) will be deleted from the table. This cannot be undone.",
		confirmWhat(body))
	assert.Equal(t, "Purge 1,204 sent and failed events where type is order.created?", textOf(between(body, `<h1 id="confirm-scope">`, `</h1>`)))
	assert.Equal(t, []string{"status: sent and failed", "type: order.created"}, facts(body), "the filter in effect, exactly")
	assert.Equal(t, []string{"sent:1200", "failed:4"}, submitted(t, body, `class="confirm"`)["expect"])
	require.Equal(t, table, e.byStatus("order.created"), "nothing done before the confirmation")

	// Replay by filter: the failed ones only, the rest left alone.
	resp = e.post("replay", submitted(t, list, `id="bulk-replay-form"`))
	body = readBody(t, resp)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	assert.Equal(t, map[string]string{
		"failed":  "4: set pending, due now, attempts reset",
		"sent":    "1,200: left alone: only failed events can be replayed",
		"pending": "3: left alone: only failed events can be replayed",
	}, tallyOf(t, body))
	assert.Equal(t, "4 failed events where type is order.created will be set pending and due now, with their attempts reset: the relay delivers them again.",
		confirmWhat(body))
	// The confirmation runs exactly that: the four failed events of the
	// type, not the failed one of another type.
	resp = e.post("replay", submitted(t, body, `class="confirm"`))
	require.Equal(t, http.StatusSeeOther, resp.StatusCode, readBody(t, resp))
	assert.Equal(t, "events?type=order.created", resp.Header.Get("Location"), "back to the list")
	assert.Equal(t, map[string]int64{"sent": 1200, "pending": 7}, e.byStatus("order.created"))
	assert.Equal(t, outbox.StatusFailed, e.row("other-failed").Status)
	_, page := e.follow(resp)
	assert.Contains(t, page, `>Replayed 4 events by `)

	// Purge by filter, confirmed: the sent ones go, the pending ones stay.
	resp = e.post("purge", submitted(t, list, `id="bulk-purge-form"`))
	body = readBody(t, resp)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	assert.Equal(t, "1,200 sent events where type is order.created will be deleted from the table. This cannot be undone.", confirmWhat(body))
	resp = e.post("purge", submitted(t, body, `class="confirm"`))
	require.Equal(t, http.StatusSeeOther, resp.StatusCode, readBody(t, resp))
	assert.Equal(t, map[string]int64{"pending": 7}, e.byStatus("order.created"))
	assert.Equal(t, map[string]int64{"sent": 1, "failed": 1}, e.byStatus("order.paid"), "another type untouched")
	_, page = e.follow(resp)
	assert.Contains(t, page, `>Purged 1,200 events by `)
}

// pickForm is what the list's selection form sends with these rows ticked.
func pickForm(t testing.TB, list string, ids ...string) url.Values {
	t.Helper()
	v := submitted(t, list, `id="pick"`)
	require.Equal(t, "selected", v.Get("scope"))
	for _, id := range ids {
		require.Contains(t, list, `<input type="checkbox" form="pick" name="id" value="`+id+`">`, "a checkbox for %s", id)
		v.Add("id", id)
	}
	return v
}

func testSelection(t *testing.T, b backend) {
	e := setup(t, b, outboxui.Options{AllowActions: true})
	seed(e) // ok-1, ok-2 sent; bad-1, bad-2 failed; new-1, new-2 pending
	_, list := e.get("events?limit=10")
	assert.Contains(t, list, `<button type="submit" id="pick-replay" formaction="replay">Replay ticked…</button>`)
	assert.Contains(t, list, `<input type="hidden" name="back" value="events?limit=10">`)

	// Nothing ticked: a 400 saying what to do.
	resp := e.post("replay", pickForm(t, list))
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
	assert.Contains(t, readBody(t, resp), "no event selected")

	// Replay of a failed, a sent and a pending event ticked: the failed
	// one only.
	resp = e.post("replay", pickForm(t, list, "bad-1", "ok-1", "new-1"))
	body := readBody(t, resp)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	assert.Equal(t, "Replay 1 failed event of the 3 selected?", textOf(between(body, `<h1 id="confirm-scope">`, `</h1>`)))
	assert.Equal(t, "1 failed event of the 3 selected will be set pending and due now, with its attempts reset: the relay delivers it again.", confirmWhat(body))
	assert.Equal(t, map[string]string{
		"failed":  "1: set pending, due now, attempts reset",
		"pending": "1: left alone: only failed events can be replayed",
		"sent":    "1: left alone: only failed events can be replayed",
	}, tallyOf(t, body))
	assert.Equal(t, []string{"selected: 3 events ticked on the list", "IDs: bad-1, new-1, ok-1", "status: failed (those replay touches)"}, facts(body))
	assert.Equal(t, []string{"bad-1"}, ids(between(body, `<table class="rows">`, `</table>`)), "the events it touches")
	assert.Equal(t, outbox.StatusFailed, e.row("bad-1").Status, "nothing done before the confirmation")
	resp = e.post("replay", submitted(t, body, `class="confirm"`))
	require.Equal(t, http.StatusSeeOther, resp.StatusCode, readBody(t, resp))
	assert.Equal(t, "events?limit=10", resp.Header.Get("Location"), "back to the list it came from")
	assert.Equal(t, map[string]outbox.Status{"bad-1": outbox.StatusPending, "bad-2": outbox.StatusFailed,
		"ok-1": outbox.StatusSent, "ok-2": outbox.StatusSent, "new-1": outbox.StatusPending, "new-2": outbox.StatusPending},
		e.statuses("bad-1", "bad-2", "ok-1", "ok-2", "new-1", "new-2"), "exactly the ticked failed event")

	// Purge of a sent, a failed and a pending one, and one since gone.
	form := pickForm(t, list, "ok-2", "bad-2", "new-2")
	form.Add("id", "gone") // purged since the list was shown
	resp = e.post("purge", form)
	body = readBody(t, resp)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	assert.Equal(t, map[string]string{
		"sent":    "1: deleted",
		"failed":  "1: deleted",
		"pending": "1: left alone: pending events are never purged",
		"gone":    "1: nothing: purged, or never written",
	}, tallyOf(t, body))
	assert.Equal(t, "2 events of the 4 selected (1 sent, 1 failed) will be deleted from the table. This cannot be undone.", confirmWhat(body))
	resp = e.post("purge", submitted(t, body, `class="confirm"`))
	require.Equal(t, http.StatusSeeOther, resp.StatusCode, readBody(t, resp))
	n, err := e.ob.Count(e.db.WithContext(t.Context()), outbox.Filter{IDs: []string{"ok-2", "bad-2"}})
	require.NoError(t, err)
	assert.Zero(t, n, "the two deleted")
	assert.Equal(t, map[string]int64{"sent": 1, "pending": 3}, e.byStatus(""), "and nothing else")
}

func testChangedAsksAgain(t *testing.T, b backend) {
	logs := &syncBuffer{}
	e := setup(t, b, outboxui.Options{AllowActions: true, Logger: slog.New(slog.NewTextHandler(logs, nil))})
	seed(e)

	// A selection of which one event is replayed by someone else between
	// the confirmation and its button.
	_, list := e.get("events")
	resp := e.post("replay", pickForm(t, list, "bad-1", "bad-2"))
	confirm := readBody(t, resp)
	require.Equal(t, http.StatusOK, resp.StatusCode, confirm)
	assert.Equal(t, []string{"failed:2"}, submitted(t, confirm, `class="confirm"`)["expect"])
	n, err := e.ob.Replay(e.db.WithContext(t.Context()), outbox.Filter{IDs: []string{"bad-2"}})
	require.NoError(t, err)
	require.Equal(t, 1, n)
	e.failWith = "still broken"
	e.drain() // bad-2 fails again, with attempts anew: a row that moved
	_, err = e.ob.Replay(e.db.WithContext(t.Context()), outbox.Filter{IDs: []string{"bad-2"}})
	require.NoError(t, err) // and is pending now
	resp = e.post("replay", submitted(t, confirm, `class="confirm"`))
	again := readBody(t, resp)
	require.Equal(t, http.StatusConflict, resp.StatusCode, again)
	assert.Equal(t, "The events this would touch changed since the confirmation was shown: it counted 2 failed, now 1 failed. Nothing was done: check the numbers below and confirm again.",
		textOf(between(again, `<p class="error" role="alert" id="confirm-changed">`, `</p>`)))
	assert.Equal(t, outbox.StatusFailed, e.row("bad-1").Status, "nothing done")
	assert.Equal(t, map[string]string{
		"failed":  "1: set pending, due now, attempts reset",
		"pending": "1: left alone: only failed events can be replayed",
	}, tallyOf(t, again), "the new counts")
	assert.Contains(t, logs.String(), `msg="outboxui: replay asked again"`)
	assert.NotContains(t, logs.String(), `msg="outboxui: replay" `, "no action logged")
	// Its new button runs it.
	resp = e.post("replay", submitted(t, again, `class="confirm"`))
	require.Equal(t, http.StatusSeeOther, resp.StatusCode, readBody(t, resp))
	assert.Equal(t, outbox.StatusPending, e.row("bad-1").Status)

	// A filter that a new event comes to match meanwhile.
	e.failWith = "broker said no"
	e.publish(outbox.Event{ID: "bad-3", Type: "fails.card"})
	e.drain() // bad-1 and bad-2 fail again: with bad-3, 3 failed
	require.Equal(t, map[string]int64{"failed": 3, "sent": 4}, e.byStatus(""))
	_, list = e.get("events?status=failed")
	resp = e.post("purge", submitted(t, list, `id="bulk-purge-form"`))
	confirm = readBody(t, resp)
	require.Equal(t, http.StatusOK, resp.StatusCode, confirm)
	require.Equal(t, map[string]string{"failed": "3: deleted"}, tallyOf(t, confirm))
	e.publish(outbox.Event{ID: "bad-4", Type: "fails.card"})
	e.drain()
	resp = e.post("purge", submitted(t, confirm, `class="confirm"`))
	again = readBody(t, resp)
	require.Equal(t, http.StatusConflict, resp.StatusCode, again)
	assert.Contains(t, again, "it counted 3 failed, now 4 failed. Nothing was done")
	assert.Equal(t, map[string]int64{"failed": 4, "sent": 4}, e.byStatus(""), "nothing deleted")
	resp = e.post("purge", submitted(t, again, `class="confirm"`))
	require.Equal(t, http.StatusSeeOther, resp.StatusCode, readBody(t, resp))
	assert.Equal(t, map[string]int64{"sent": 4}, e.byStatus(""))

	// A form without the counts (a script's, an old page's) only shows the
	// confirmation.
	resp = e.post("replay", url.Values{"csrf": {e.token()}, "status": {"failed"}, "confirm": {"yes"}})
	body := readBody(t, resp)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Contains(t, body, `id="confirm-nothing"`)
	resp = e.post("purge", url.Values{"csrf": {e.token()}, "status": {"sent"}, "confirm": {"yes"}})
	body = readBody(t, resp)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Contains(t, body, `<span id="confirm-count">4</span>`)
	assert.Equal(t, map[string]int64{"sent": 4}, e.byStatus(""), "nothing deleted")
}

var logLineRE = regexp.MustCompile(`(?m)^.*msg="outboxui: (replay|purge)" .*$`)

func testIdentityLogged(t *testing.T, b backend) {
	logs := &syncBuffer{}
	e := setup(t, b, outboxui.Options{AllowActions: true, ShowPayloads: true,
		Logger:   slog.New(slog.NewTextHandler(logs, nil)),
		Identity: func(r *http.Request) string { return r.Header.Get("X-Operator") },
	})
	e.publish(outbox.Event{ID: "secret", Type: "fails.pay", Payload: map[string]any{"card": "4242-4242-4242-4242"}})
	seed(e)
	_, list := e.get("events")
	as := func(who string) []string {
		if who == "" {
			return nil
		}
		return []string{"X-Operator", who}
	}
	resp := e.post("replay", pickForm(t, list, "bad-1", "ok-1", "secret"), as("alice@example.com")...)
	confirm := readBody(t, resp)
	require.Equal(t, http.StatusOK, resp.StatusCode, confirm)
	resp = e.post("replay", submitted(t, confirm, `class="confirm"`), as("alice@example.com")...)
	require.Equal(t, http.StatusSeeOther, resp.StatusCode, readBody(t, resp))
	_, page := e.follow(resp)
	assert.Contains(t, page, `<p class="flash" role="status" id="flash">Replayed 2 events by alice@example.com: pending again, due now.</p>`)

	// By filter, and without an identity: the client's address stands in.
	_, list = e.get("events?type=fails.mail")
	resp = e.post("purge", submitted(t, list, `id="bulk-purge-form"`))
	confirm = readBody(t, resp)
	resp = e.post("purge", submitted(t, confirm, `class="confirm"`))
	require.Equal(t, http.StatusSeeOther, resp.StatusCode, readBody(t, resp))
	_, page = e.follow(resp)
	assert.Regexp(t, `id="flash">Purged 1 event by 127\.0\.0\.1:\d+\.</p>`, page)

	lines := logLineRE.FindAllString(logs.String(), -1)
	require.Len(t, lines, 2, logs.String())
	assert.Regexp(t, `level=INFO msg="outboxui: replay" who=alice@example.com action=replay scope=selection selected=3 events=2 remote_addr=127\.0\.0\.1:\d+$`, lines[0])
	assert.Regexp(t, `level=INFO msg="outboxui: purge" who=127\.0\.0\.1:\d+ action=purge scope=filter filter="type=fails.mail" events=1 remote_addr=`, lines[1])
	assert.NotContains(t, logs.String(), "4242", "never payloads")
}

func testReadOnlyScopes(t *testing.T, b backend) {
	e := setup(t, b, outboxui.Options{})
	seed(e)
	_, list := e.get("events")
	assert.NotContains(t, list, `id="pick"`, "no selection form")
	assert.NotContains(t, list, `type="checkbox" form="pick"`, "no checkboxes in the rows")
	// A token pair that would pass the form check: the refusal is the
	// read-only one, not the missing token's.
	tok := strings.Repeat("ab", 32)
	u, err := url.Parse(e.base)
	require.NoError(t, err)
	e.client.Jar.SetCookies(u, []*http.Cookie{{Name: "outboxui_csrf", Value: tok}})
	for _, verb := range []string{"replay", "purge"} {
		for _, form := range []url.Values{
			{"scope": {"selected"}, "id": {"bad-1", "ok-1"}, "confirm": {"yes"}, "expect": {"failed:1"}},
			{"scope": {"filter"}, "status": {"failed"}, "confirm": {"yes"}, "expect": {"failed:2"}},
			{"scope": {"filter"}},
		} {
			form.Set("csrf", tok)
			resp := e.post(verb, form)
			assert.Equal(t, http.StatusForbidden, resp.StatusCode, "%s %v", verb, form)
			assert.Contains(t, readBody(t, resp), "this dashboard is read-only (outboxui.Options.AllowActions is false)")
		}
	}
	assert.Equal(t, map[string]int64{"sent": 2, "failed": 2, "pending": 2}, e.byStatus(""), "nothing changed")
}
