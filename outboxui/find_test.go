package outboxui_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/outboxui"
)

// TestFind runs the tests of issue 25's first slice (search, paging both
// ways, the live fragment, the event's neighbours, the replay marker) on
// every database, as TestDashboard does.
func TestFind(t *testing.T) {
	tests := map[string]func(*testing.T, backend){
		"SearchByEachKey":   testSearch,
		"PagingBothWays":    testPagingBothWays,
		"PagingWithInserts": testPagingWithInserts,
		"LiveFragment":      testLiveFragment,
		"Neighbours":        testNeighbours,
		"ReplayMarker":      testReplayMarker,
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

// link returns the href of the element with this id on the page, "" when
// there is none.
func link(body, id string) string {
	marker := `id="` + id + `" href="`
	i := strings.Index(body, marker)
	if i < 0 {
		return ""
	}
	rest := body[i+len(marker):]
	return strings.ReplaceAll(rest[:strings.IndexByte(rest, '"')], "&amp;", "&")
}

func testSearch(t *testing.T, b backend) {
	e := setup(t, b, outboxui.Options{AllowActions: true})
	seed(e)
	// A key that reads like an aggregate: the key wins, being an exact match.
	e.publish(outbox.Event{ID: "inv-1", Type: "invoice.issued", AggregateType: "invoice", AggregateID: "42", IdempotencyKey: "invoice:42"},
		outbox.Event{ID: "inv-2", Type: "invoice.issued", AggregateType: "invoice", AggregateID: "42"})
	for _, c := range []struct {
		query string
		want  []string
		as    string
	}{
		{"q=bad-2", []string{"bad-2"}, "as event ID"},
		{"q=+new-1+", []string{"new-1"}, "as event ID"},
		{"q=invoice:42", []string{"inv-1"}, "as idempotency key (of event inv-1)"},
		{"q=order:1", []string{"ok-1", "ok-2"}, "as aggregate"},
		{"q=invoice:+42", []string{"inv-1", "inv-2"}, "as aggregate"},
		{"q=order.created", []string{"ok-1", "new-1", "new-2"}, "as event type"},
		{"q=order.created&status=pending", []string{"new-1", "new-2"}, "as event type"},
		{"q=order:1&status=sent,failed", []string{"ok-1", "ok-2"}, "as aggregate"},
		{"q=fails.mail&status=pending", nil, "as event type"},
		{"q=nothing-like-this", nil, "no event has this ID, idempotency key or type"},
	} {
		code, body := e.get("events?" + c.query)
		require.Equal(t, http.StatusOK, code, "%s: %s", c.query, body)
		assert.Equal(t, newestFirst(c.want), ids(between(body, `<div id="live-list"`, `</table>`)), c.query)
		effect := between(body, `<p class="in-effect"`, `</p>`)
		assert.Contains(t, effect, c.as, "%s: the page says how it read the search", c.query)
		q, _ := url.ParseQuery(c.query)
		if st := q.Get("status"); st != "" {
			assert.Contains(t, effect, "status "+strings.Split(st, ",")[0], "%s: and the status filter beside it", c.query)
		}
		// The search box shows the text, to edit it.
		assert.Contains(t, body, `name="q" id="f-q" value="`+strings.TrimSpace(q.Get("q"))+`"`, c.query)
		// The bulk actions act on the resolved filter: the same events.
		if len(c.want) > 0 && strings.Contains(body, `id="bulk-purge-form"`) {
			sub := submitted(t, body, `id="bulk-purge-form"`)
			assert.Empty(t, sub.Get("q"), "%s: the bulk form carries the resolved filter, not the text", c.query)
		}
	}

	// Each chip drops its term and keeps the others.
	_, body := e.get("events?q=order.created&status=pending&limit=7")
	effect := between(body, `<p class="in-effect"`, `</p>`)
	assert.Contains(t, effect, `href="events?limit=7&amp;status=pending"`, "dropping the search keeps the status and page size")
	assert.Contains(t, effect, `href="events?limit=7&amp;q=order.created"`, "dropping the status keeps the search")
	_, body = e.get("events")
	assert.Contains(t, body, "No filter: every event.")

	// The search and a field it would set: refused, saying which.
	code, body := e.get("events?q=bad-2&id=new-1")
	assert.Equal(t, http.StatusBadRequest, code)
	assert.Contains(t, body, "reads as event ID, and the IDs field is set too")
	code, _ = e.get("events?q=order:1&aggregate_type=user")
	assert.Equal(t, http.StatusBadRequest, code)

	// A bulk replay by search acts on what the search lists.
	resp := e.post("replay", url.Values{"csrf": {e.token()}, "q": {"fails.card"}})
	body = readBody(t, resp)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	assert.Contains(t, body, `<span id="confirm-count">1</span>`)
	assert.Contains(t, body, `<input type="hidden" name="type" value="fails.card">`, "the confirmation carries the resolved filter")
}

func testPagingBothWays(t *testing.T, b backend) {
	e := setup(t, b, outboxui.Options{})
	var events []outbox.Event
	for i := range 25 {
		events = append(events, outbox.Event{ID: "e" + pad(i), Type: "paged"})
	}
	e.publish(events...)
	want := func(from, to int) []string {
		var out []string
		for i := from; ; {
			out = append(out, "e"+pad(i))
			if i == to {
				return out
			}
			if from < to {
				i++
			} else {
				i--
			}
		}
	}
	page := func(path string) (string, []string) {
		t.Helper()
		require.NotEmpty(t, path, "no link")
		code, body := e.get(path)
		require.Equal(t, http.StatusOK, code, "%s: %s", path, body)
		return body, ids(body)
	}
	for _, order := range []string{"&order=oldest", "", "&order=newest"} {
		first := "events?type=paged&limit=10" + order
		p1, got := page(first)
		asc := order == "&order=oldest"
		w1, w2, w3 := want(0, 9), want(10, 19), want(20, 24)
		if !asc {
			w1, w2, w3 = want(24, 15), want(14, 5), want(4, 0)
		}
		assert.Equal(t, w1, got, "page 1%s", order)
		assert.Empty(t, link(p1, "prev"), "no Previous on the first page")
		p2, got := page(link(p1, "next"))
		assert.Equal(t, w2, got, "page 2%s", order)
		p3, got := page(link(p2, "next"))
		assert.Equal(t, w3, got, "page 3%s: the last, short", order)
		assert.Empty(t, link(p3, "next"), "no Next on the last page")
		// Back: page 2 again, then page 1, which says it is the first.
		b2, got := page(link(p3, "prev"))
		assert.Equal(t, w2, got, "Previous from page 3%s", order)
		assert.NotEmpty(t, link(b2, "next"))
		b1, got := page(link(b2, "prev"))
		assert.Equal(t, w1, got, "Previous from page 2%s", order)
		assert.Empty(t, link(b1, "prev"), "back on the first page: no Previous")
		assert.Contains(t, link(b1, "next"), "limit=10", "the links keep the page size")
		assert.Contains(t, link(b1, "next"), "type=paged", "and the filter")
	}
	// A page boundary: Previous from a page whose predecessor is short
	// (a cursor in the middle) shows the first page, full.
	_, got := page("events?type=paged&limit=10&order=oldest&before=" + seqOf(e, "e004"))
	assert.Equal(t, want(0, 9), got, "fewer than a page before: the first page")
	_, got = page("events?type=paged&limit=10&after=" + seqOf(e, "e020"))
	assert.Equal(t, want(24, 15), got, "newest first, the same: the first page")
	// Exactly two pages: the second has no Next.
	_, body := e.get("events?type=paged&limit=5&order=oldest&after=" + seqOf(e, "e019"))
	assert.Equal(t, want(20, 24), ids(body))
	assert.Empty(t, link(body, "next"), "the last full page has no Next")
	assert.NotEmpty(t, link(body, "prev"))
	// Past the end: nothing, and Previous leads back.
	_, body = e.get("events?type=paged&limit=5&order=oldest&after=" + seqOf(e, "e024"))
	assert.Empty(t, ids(body))
	_, got = page(link(body, "prev"))
	assert.Equal(t, want(20, 24), got)
	code, body := e.get("events?type=paged&after=3&before=9")
	assert.Equal(t, http.StatusBadRequest, code)
	assert.Contains(t, body, "after and before: give one")
	code, _ = e.get("events?type=paged&before=x")
	assert.Equal(t, http.StatusBadRequest, code)
}

func seqOf(e *env, id string) string { return itoa(int(e.row(id).Seq)) }

// testPagingWithInserts writes events between page loads: no page shifts,
// either way, in either order.
func testPagingWithInserts(t *testing.T, b backend) {
	e := setup(t, b, outboxui.Options{})
	var events []outbox.Event
	for i := range 20 {
		events = append(events, outbox.Event{ID: "e" + pad(i), Type: "paged"})
	}
	e.publish(events...)
	n := 100
	insert := func() {
		var evs []outbox.Event
		for range 7 {
			evs = append(evs, outbox.Event{ID: "e" + pad(n), Type: "paged"})
			n++
		}
		e.publish(evs...)
	}
	_, p1 := e.get("events?type=paged&limit=10&order=oldest")
	first := ids(p1)
	insert()
	_, p2 := e.get(link(p1, "next"))
	assert.Equal(t, []string{"e010", "e011", "e012", "e013", "e014", "e015", "e016", "e017", "e018", "e019"}, ids(p2),
		"oldest first: the next page is the one that followed")
	insert()
	_, back := e.get(link(p2, "prev"))
	assert.Equal(t, first, ids(back), "and Previous the one before")

	_, n1 := e.get("events?type=paged&limit=10")
	newest := ids(n1)
	assert.Equal(t, "e113", newest[0])
	insert()
	_, n2 := e.get(link(n1, "next"))
	assert.Equal(t, "e103", ids(n2)[0], "newest first: the next page follows the first, whatever was written since")
	insert()
	_, nb := e.get(link(n2, "prev"))
	assert.Equal(t, newest, ids(nb), "and Previous is the page it was, not the newest rows")
}

func testLiveFragment(t *testing.T, b backend) {
	e := setup(t, b, outboxui.Options{Refresh: 1500 * time.Millisecond})
	seed(e)
	code, body := e.get("events?status=pending")
	require.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, liveJS, "the list loads live.js")
	assert.Contains(t, body, `data-refresh="1500"`)
	assert.Contains(t, body, `id="updated"`, "and says when it was updated")
	code, frag := e.get("events?status=pending&live=1")
	require.Equal(t, http.StatusOK, code)
	assert.True(t, strings.HasPrefix(strings.TrimSpace(frag), `<div id="live-warning" data-live>`), frag)
	assert.Contains(t, frag, `id="warning-no-relay"`, "the warning is live: two events pending, no relay")
	assert.Contains(t, frag, `<p class="summary" id="live-summary" data-live aria-live="polite"`)
	assert.Contains(t, frag, `<div id="live-list" data-live>`)
	assert.NotContains(t, frag, "<html", "only the fragment")
	assert.NotContains(t, frag, `class="filter"`, "not the form: what is typed there stays")
	assert.Contains(t, frag, `<span id="total">2</span>`)
	e.publish(outbox.Event{ID: "new-3", Type: "order.created"})
	_, frag = e.get("events?status=pending&live=1")
	assert.Contains(t, frag, `<span id="total">3</span>`, "the fragment is fresh")
	_, frag = e.get("?live=1")
	assert.Contains(t, frag, `id="count-pending">3<`)
	assert.NotContains(t, frag, "<html")

	resp, err := e.client.Get(e.base + "live.js")
	require.NoError(t, err)
	js := readBody(t, resp)
	resp.Body.Close()
	assert.Equal(t, "text/javascript; charset=utf-8", resp.Header.Get("Content-Type"))
	assert.Contains(t, js, "data-live")
	assert.Contains(t, resp.Header.Get("Content-Security-Policy"), "script-src 'self'")

	// Off: no script, and the pages still say when they were rendered.
	off := setup(t, b, outboxui.Options{Refresh: -1})
	_, body = off.get("events")
	assert.NotContains(t, body, "<script")
	// The event and confirmation pages never refresh.
	_, body = e.get("event?id=new-1")
	assert.NotContains(t, body, "<script")
}

func testNeighbours(t *testing.T, b backend) {
	e := setup(t, b, outboxui.Options{})
	e.publish(outbox.Event{ID: "a-1", Type: "order.created", AggregateType: "order", AggregateID: "7"},
		outbox.Event{ID: "other", Type: "order.created", AggregateType: "order", AggregateID: "8"})
	e.drain()
	e.publish(outbox.Event{ID: "a-2", Type: "fails.pay", AggregateType: "order", AggregateID: "7"})
	e.drain()
	e.publish(outbox.Event{ID: "a-3", Type: "order.shipped", AggregateType: "order", AggregateID: "7"})

	_, body := e.get("event?id=a-2")
	assert.Contains(t, between(body, `id="prev-event"`, `</td>`), `href="event?id=a-1"`)
	assert.Contains(t, between(body, `id="prev-event"`, `</td>`), `<span class="status sent">sent</span>`)
	assert.Contains(t, between(body, `id="next-event"`, `</td>`), `href="event?id=a-3"`)
	assert.Contains(t, between(body, `id="next-event"`, `</td>`), `<span class="status pending">pending</span>`)
	assert.NotContains(t, body, `id="held-back"`, "a failed event is not held back")

	_, body = e.get("event?id=a-3")
	assert.Contains(t, between(body, `id="prev-event"`, `</td>`), `href="event?id=a-2"`)
	assert.Contains(t, between(body, `id="prev-event"`, `</td>`), "failed")
	assert.Contains(t, between(body, `id="next-event"`, `</td>`), "none")
	assert.Contains(t, between(body, `<p class="note" id="held-back">`, `</p>`), "is failed")

	_, body = e.get("event?id=a-1")
	assert.Contains(t, between(body, `id="prev-event"`, `</td>`), "none")
	assert.Contains(t, between(body, `id="next-event"`, `</td>`), `href="event?id=a-2"`, "not the other aggregate's event")

	e.publish(outbox.Event{ID: "loose", Type: "x"})
	_, body = e.get("event?id=loose")
	assert.NotContains(t, body, `id="neighbours"`, "no aggregate, no neighbours")
}

func testReplayMarker(t *testing.T, b backend) {
	e := setup(t, b, outboxui.Options{AllowActions: true})
	e.publish(outbox.Event{ID: "r-1", Type: "fails.webhook"})
	e.failWith = "webhook: 503"
	e.drain()
	_, body := e.get("event?id=r-1")
	assert.Contains(t, body, `<h2 id="last-error-heading">Last error</h2>`)
	assert.NotContains(t, body, "before the replay")

	resp := e.post("replay", submitted(t, body, `id="replay"`)) // the event page's button
	require.Equal(t, http.StatusSeeOther, resp.StatusCode, readBody(t, resp))
	r := e.row("r-1")
	require.Equal(t, outbox.StatusPending, r.Status)
	require.Zero(t, r.Attempts)
	require.NotNil(t, r.LastError, "the row keeps the old error")
	_, body = e.get("event?id=r-1")
	assert.Contains(t, body, `<h2 id="last-error-heading">Last error, from before the replay</h2>`)
	assert.Contains(t, body, `id="replay-note"`)
	assert.Contains(t, body, `class="err before-replay" id="last-error">webhook: 503 (permanent)<`)

	assert.Contains(t, between(body, `id="replay-note"`, `</p>`), "by 127.0.0.1", "the history says when and by whom")
	assert.Contains(t, between(body, `id="history"`, `</table>`), "replayed")

	// Its first attempt since the replay in flight (claimed: attempts 1,
	// leased): still from before. The lease expired with no result: the
	// history still tells (the columns alone could not).
	lease := func(until time.Time) {
		res := e.db.Exec("UPDATE "+e.ob.Table()+" SET attempts = 1, locked_until = ? WHERE named_id = ?", e.b.timeArg(until), "r-1")
		require.NoError(t, res.Error)
		require.EqualValues(t, 1, res.RowsAffected)
	}
	lease(time.Now().Add(time.Minute))
	_, body = e.get("event?id=r-1")
	assert.Contains(t, body, "its first attempt since in flight")
	assert.Contains(t, body, `Last error, from before the replay`)
	lease(time.Now().Add(-time.Minute))
	_, body = e.get("event?id=r-1")
	assert.Contains(t, body, `Last error, from before the replay`)
	res := e.db.Exec("UPDATE "+e.ob.Table()+" SET attempts = 0, locked_until = NULL WHERE named_id = ?", "r-1")
	require.NoError(t, res.Error)

	// It fails again: the error is current again.
	e.failWith = "webhook: 410 gone"
	e.drain()
	_, body = e.get("event?id=r-1")
	assert.Contains(t, body, `<h2 id="last-error-heading">Last error</h2>`)
	assert.Contains(t, body, `class="err" id="last-error">webhook: 410 gone (permanent)<`)
	assert.NotContains(t, body, "before the replay")
}
