package outboxui_test

import (
	"cmp"
	"encoding/json"
	"html"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/outboxui"
)

// TestDashboard runs every dashboard test on SQLite, PostgreSQL and
// MySQL/MariaDB.
func TestDashboard(t *testing.T) {
	tests := map[string]func(*testing.T, backend){
		"Overview":             testOverview,
		"ListFilters":          testListFilters,
		"FilterFormShows":      testFilterFormShowsFilter,
		"FilterFormRoundTrip":  testFormRoundTrip,
		"ListPaging":           testListPaging,
		"BadFilter":            testBadFilter,
		"EventDetail":          testEventDetail,
		"Escaping":             testEscaping,
		"ReadOnly":             testReadOnly,
		"CrossOriginRefused":   testCrossOrigin,
		"ReplayOne":            testReplayOne,
		"BulkReplayConfirms":   testBulkReplay,
		"Purge":                testPurge,
		"BulkActionsSayScope":  testBulkScope,
		"MountedWithoutStrip":  testMountedWithoutStrip,
		"RoutesAndHeaders":     testRoutesAndHeaders,
		"NilOutboxFindsPlugin": testNilOutbox,
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

// seed writes two sent, two failed and two pending events.
func seed(e *env) {
	e.publish(
		outbox.Event{ID: "ok-1", Type: "order.created", AggregateType: "order", AggregateID: "1"},
		outbox.Event{ID: "ok-2", Type: "order.paid", AggregateType: "order", AggregateID: "1"},
		outbox.Event{ID: "bad-1", Type: "fails.card", AggregateType: "payment", AggregateID: "9"},
	)
	e.failWith = "card declined: insufficient funds"
	e.drain()
	e.publish(outbox.Event{ID: "bad-2", Type: "fails.mail", AggregateType: "user", AggregateID: "7"})
	e.failWith = "SMTP 550 mailbox unavailable"
	e.drain()
	// Pending: published after the drain, no relay since.
	e.publish(
		outbox.Event{ID: "new-1", Type: "order.created", AggregateType: "order", AggregateID: "2"},
		outbox.Event{ID: "new-2", Type: "order.created", AggregateType: "order", AggregateID: "3"},
	)
}

// ids returns the event IDs linked from a page, in order.
func ids(body string) []string {
	var out []string
	for _, part := range strings.Split(body, `href="event?id=`)[1:] {
		id, err := url.QueryUnescape(part[:strings.IndexByte(part, '"')])
		if err != nil {
			id = "(bad escape) " + part
		}
		out = append(out, id)
	}
	return out
}

func testOverview(t *testing.T, b backend) {
	e := setup(t, b, outboxui.Options{})
	seed(e)
	e.backdate("new-1", time.Now().Add(-90*time.Minute))
	code, body := e.get("")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `id="count-pending">2<`)
	assert.Contains(t, body, `id="count-failed">2<`)
	assert.Contains(t, body, `id="count-sent">2<`)
	// The oldest pending age reads the table (created_at of new-1), not a
	// hard-coded text: 1h30m, give or take the test's own duration.
	assert.Regexp(t, `id="oldest-pending">1h3\dm old<`, body)
	assert.Contains(t, body, `id="failed-window">2<`, "failed in the last hour, the default window")
	assert.Equal(t, []string{"bad-2", "bad-1"}, ids(body), "the overview lists the failed events, newest first")
	assert.Contains(t, body, "card declined: insufficient funds")
}

func testListFilters(t *testing.T, b backend) {
	e := setup(t, b, outboxui.Options{})
	seed(e)
	old := time.Date(2026, 1, 2, 10, 0, 0, 0, time.UTC)
	e.backdate("ok-1", old)
	e.backdate("bad-1", old.Add(time.Hour))
	for _, c := range []struct {
		query string
		want  []string
	}{
		{"", []string{"ok-1", "ok-2", "bad-1", "bad-2", "new-1", "new-2"}},
		{"status=failed", []string{"bad-1", "bad-2"}},
		{"status=pending,sent", []string{"ok-1", "ok-2", "new-1", "new-2"}},
		{"status=pending&status=failed", []string{"bad-1", "bad-2", "new-1", "new-2"}},
		{"type=order.created", []string{"ok-1", "new-1", "new-2"}},
		{"type=order.paid,+fails.mail", []string{"ok-2", "bad-2"}},
		{"aggregate_type=order&aggregate_id=1", []string{"ok-1", "ok-2"}},
		{"aggregate_type=order&status=pending", []string{"new-1", "new-2"}},
		{"error=INSUFFICIENT", []string{"bad-1"}},
		{"error=550&status=failed", []string{"bad-2"}},
		{"until=2026-01-02T10:30", []string{"ok-1"}},
		{"since=2026-01-02T10:30&until=2026-01-03", []string{"bad-1"}},
		{"since=2026-01-02", []string{"ok-1", "ok-2", "bad-1", "bad-2", "new-1", "new-2"}},
		{"since=1h", []string{"ok-2", "bad-2", "new-1", "new-2"}},
		{"until=1h", []string{"ok-1", "bad-1"}},
		{"until=0.5d", []string{"ok-1", "bad-1"}},
		{"since=7d", []string{"ok-2", "bad-2", "new-1", "new-2"}},
		{"id=bad-2&id=new-1", []string{"bad-2", "new-1"}},
		{"type=nothing", nil},
	} {
		code, body := e.get("events?" + c.query)
		require.Equal(t, http.StatusOK, code, "%s: %s", c.query, body)
		assert.Equal(t, newestFirst(c.want), ids(body), "%s: newest first, the default", c.query)
		_, body = e.get("events?order=oldest&" + c.query)
		assert.Equal(t, c.want, ids(body), "%s: oldest first", c.query)
		assert.Contains(t, body, `<span id="total">`+itoa(len(c.want))+`</span>`, c.query)
	}
	// The form shows the filter it applied.
	_, body := e.get("events?status=failed&type=fails.card&error=declined&since=24h")
	assert.Equal(t, url.Values{"status": {"failed"}, "type": {"fails.card"}, "error": {"declined"}, "since": {"24h"}, "limit": {"50"}},
		nonEmpty(submitted(t, body, `class="filter"`)))
}

// testFilterFormShowsFilter checks that the list's form shows every term
// of the filter in effect, as the query gave it: several statuses, a page
// size that is no preset, IDs.
func testFilterFormShowsFilter(t *testing.T, b backend) {
	e := setup(t, b, outboxui.Options{AllowActions: true})
	seed(e)
	for _, c := range []struct {
		query string
		want  url.Values // what the form sends, unchanged
	}{
		{"status=failed,pending&limit=8", url.Values{"status": {"pending", "failed"}, "limit": {"8"}}},
		{"status=failed&status=pending", url.Values{"status": {"pending", "failed"}, "limit": {"50"}}},
		{"status=sent,+failed,sent&limit=7&order=newest", url.Values{"status": {"sent", "failed"}, "limit": {"7"}}}, // newest: the default
		{"status=sent&order=oldest", url.Values{"status": {"sent"}, "limit": {"50"}, "order": {"oldest"}}},
		{"limit=08", url.Values{"limit": {"8"}}},
		{"id=bad-2&id=new-1&aggregate_type=order&aggregate_id=2&until=1h", url.Values{"id": {"bad-2", "new-1"},
			"aggregate_type": {"order"}, "aggregate_id": {"2"}, "until": {"1h"}, "limit": {"50"}}},
	} {
		code, body := e.get("events?" + c.query)
		require.Equal(t, http.StatusOK, code, "%s: %s", c.query, body)
		assert.Equal(t, c.want, nonEmpty(submitted(t, body, `class="filter"`)), c.query)
	}
	// The IDs are shown, not only carried: the operator sees them and can
	// untick one.
	_, body := e.get("events?id=bad-2&id=new-1")
	assert.Contains(t, body, `<input type="checkbox" name="id" value="bad-2" checked>`)
	assert.Contains(t, body, `<input type="checkbox" name="id" value="new-1" checked>`)
}

// testFormRoundTrip submits the list's form unchanged, as a browser does
// when the operator presses Filter: the same list comes back, with the
// same bulk actions acting on the same events.
func testFormRoundTrip(t *testing.T, b backend) {
	e := setup(t, b, outboxui.Options{AllowActions: true})
	seed(e)
	e.backdate("ok-1", time.Date(2026, 1, 2, 10, 0, 0, 0, time.UTC))
	for _, q := range []string{
		"status=failed,pending&limit=8", // the issue's
		"status=failed,pending&limit=1",
		"status=failed&status=pending",
		"status=sent,failed&limit=3",
		"limit=3",
		"limit=3&order=newest",
		"limit=3&order=oldest",
		"type=order.paid,+fails.mail",
		"aggregate_type=order&aggregate_id=1",
		"error=declined",
		"status=failed&error=550",
		"since=2026-01-02T10:30",
		"until=2026-01-03",
		"since=1h",
		"id=bad-2&id=new-1",
		"id=bad-1&status=failed",
		"status=pending&type=order.created&aggregate_type=order&limit=1&order=newest",
		"status=sent",
	} {
		code, body := e.get("events?" + q)
		require.Equal(t, http.StatusOK, code, "%s: %s", q, body)
		sub := submitted(t, body, `class="filter"`)
		code, again := e.get("events?" + sub.Encode())
		require.Equal(t, http.StatusOK, code, "%s → %s: %s", q, sub.Encode(), again)
		assert.Equal(t, ids(body), ids(again), "%s → %s: the same page of events", q, sub.Encode())
		assert.Equal(t, total(t, body), total(t, again), "%s → %s: the same count", q, sub.Encode())
		assert.Equal(t, between(body, `<div class="act-group bulk">`, `</div>`), between(again, `<div class="act-group bulk">`, `</div>`),
			"%s → %s: the same bulk actions", q, sub.Encode())
		assert.Equal(t, sub, submitted(t, again, `class="filter"`), "%s: the form shows the same filter again", q)
	}
}

// nonEmpty leaves out the fields sent empty (the form's blank inputs).
func nonEmpty(v url.Values) url.Values {
	out := url.Values{}
	for k, vs := range v {
		for _, s := range vs {
			if s != "" {
				out.Add(k, s)
			}
		}
	}
	return out
}

func total(t testing.TB, body string) string {
	t.Helper()
	s := between(body, `<span id="total">`, `</span>`)
	require.NotEmpty(t, s, "no total on the page")
	return s
}

// between returns the text from the first start to the end after it,
// both included; "" without them.
func between(s, start, end string) string {
	i := strings.Index(s, start)
	if i < 0 {
		return ""
	}
	j := strings.Index(s[i:], end)
	if j < 0 {
		return ""
	}
	return s[i : i+j+len(end)]
}

var (
	controlRE = regexp.MustCompile(`<(/?)(input|select|option|textarea|button)\b([^>]*)>`)
	attrRE    = regexp.MustCompile(`([a-zA-Z-]+)(?:="([^"]*)")?`)
	numberRE  = regexp.MustCompile(`^-?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$`)
)

// submitted returns what a browser sends when the form whose opening tag
// holds marker is submitted unchanged by a button without a name: HTML's
// form data set for the controls these pages use. A select with no
// selected option sends its first option, a checkbox only when ticked,
// a number input "" for a value that is not a number.
func submitted(t testing.TB, body, marker string) url.Values {
	t.Helper()
	i := strings.Index(body, marker)
	require.GreaterOrEqual(t, i, 0, "no form %s", marker)
	start := strings.LastIndex(body[:i], "<form")
	end := strings.Index(body[start:], "</form>")
	require.True(t, start >= 0 && end >= 0, "no form %s", marker)
	src := body[start : start+end]

	v := url.Values{}
	var sel struct {
		name, first string
		multiple    bool
		chosen      []string
		options     int
	}
	inSelect := false
	for _, m := range controlRE.FindAllStringSubmatchIndex(src, -1) {
		closing, tag := src[m[2]:m[3]] == "/", src[m[4]:m[5]]
		attrs := map[string]string{}
		for _, a := range attrRE.FindAllStringSubmatch(src[m[6]:m[7]], -1) {
			attrs[a[1]] = html.UnescapeString(a[2])
		}
		_, disabled := attrs["disabled"]
		switch {
		case tag == "select" && closing:
			if sel.name != "" {
				if !sel.multiple && len(sel.chosen) == 0 && sel.options > 0 {
					sel.chosen = []string{sel.first}
				}
				if !sel.multiple && len(sel.chosen) > 1 {
					sel.chosen = sel.chosen[len(sel.chosen)-1:]
				}
				v[sel.name] = append(v[sel.name], sel.chosen...)
			}
			inSelect = false
		case tag == "select":
			inSelect = true
			sel.name, sel.first, sel.chosen, sel.options = attrs["name"], "", nil, 0
			_, sel.multiple = attrs["multiple"]
			if disabled {
				sel.name = ""
			}
		case tag == "option" && !closing && inSelect:
			val, ok := attrs["value"]
			if !ok { // the text up to the next tag, whitespace collapsed
				rest := src[m[1]:]
				val = strings.Join(strings.Fields(html.UnescapeString(rest[:strings.IndexByte(rest, '<')])), " ")
			}
			if sel.options == 0 {
				sel.first = val
			}
			sel.options++
			if _, ok := attrs["selected"]; ok {
				sel.chosen = append(sel.chosen, val)
			}
		case tag == "input" && !closing:
			name := attrs["name"]
			if name == "" || disabled {
				continue
			}
			switch typ := strings.ToLower(attrs["type"]); typ {
			case "checkbox", "radio":
				if _, ok := attrs["checked"]; ok {
					v.Add(name, cmp.Or(attrs["value"], "on"))
				}
			case "submit", "button", "reset", "image", "file":
			case "number":
				val := attrs["value"]
				if !numberRE.MatchString(val) {
					val = ""
				}
				v.Add(name, val)
			default:
				v.Add(name, attrs["value"])
			}
		case tag == "textarea":
			require.Fail(t, "submitted does not read textareas")
		}
	}
	return v
}

func itoa(n int) string { return strconv.Itoa(n) }

// newestFirst is ids, listed oldest first, in the list's default order.
func newestFirst(ids []string) []string {
	out := slices.Clone(ids)
	slices.Reverse(out)
	return out
}

func testListPaging(t *testing.T, b backend) {
	e := setup(t, b, outboxui.Options{})
	var events []outbox.Event
	for i := range 25 {
		events = append(events, outbox.Event{ID: "e" + pad(i), Type: "paged"})
	}
	e.publish(events...)
	e.publish(outbox.Event{ID: "other", Type: "not-paged"})
	var seen []string
	next := "events?type=paged&limit=10&order=oldest"
	for pages := 0; next != ""; pages++ {
		require.Less(t, pages, 5, "paging does not end")
		code, body := e.get(next)
		require.Equal(t, http.StatusOK, code, body)
		assert.Contains(t, body, `<span id="total">25</span>`, "the count covers the filter, not the page")
		page := ids(body)
		assert.LessOrEqual(t, len(page), 10)
		seen = append(seen, page...)
		next = ""
		if i := strings.Index(body, `id="next" href="`); i >= 0 {
			rest := body[i+len(`id="next" href="`):]
			next = strings.ReplaceAll(rest[:strings.IndexByte(rest, '"')], "&amp;", "&")
			assert.Contains(t, next, "type=paged", "the next page keeps the filter")
			assert.Contains(t, next, "limit=10", "and the page size")
			assert.Contains(t, next, "order=oldest", "and the order")
		}
	}
	var want []string
	for i := range 25 {
		want = append(want, "e"+pad(i))
	}
	assert.Equal(t, want, seen, "every row once, oldest first, in three pages")

	// Newest first (the default) pages backwards with before=.
	seen = nil
	next = "events?type=paged&limit=10"
	for pages := 0; next != ""; pages++ {
		require.Less(t, pages, 5, "paging does not end")
		code, body := e.get(next)
		require.Equal(t, http.StatusOK, code, body)
		seen = append(seen, ids(body)...)
		next = ""
		if i := strings.Index(body, `id="next" href="`); i >= 0 {
			rest := body[i+len(`id="next" href="`):]
			next = strings.ReplaceAll(rest[:strings.IndexByte(rest, '"')], "&amp;", "&")
			assert.NotContains(t, next, "order=", "the default order needs none")
			assert.Contains(t, next, "before=")
		}
	}
	slices.Reverse(want)
	assert.Equal(t, want, seen, "every row once, newest first")
}

func pad(i int) string {
	s := itoa(i)
	for len(s) < 3 {
		s = "0" + s
	}
	return s
}

func testBadFilter(t *testing.T, b backend) {
	e := setup(t, b, outboxui.Options{})
	for _, c := range []struct{ query, msg string }{
		{"status=stuck", `unknown status &#34;stuck&#34;`},
		{"since=yesterday", `created since &#34;yesterday&#34;: want a UTC time`},
		{"until=-5m", `created until &#34;-5m&#34;`},
		{"since=xd", `created since &#34;xd&#34;`},
		{"limit=0", `limit &#34;0&#34;: want a number from 1 to 1000`},
		{"limit=5000", `limit &#34;5000&#34;`},
		{"after=x", `after &#34;x&#34;`},
		{"order=oldest&before=0", `before &#34;0&#34;`},
	} {
		code, body := e.get("events?" + c.query)
		assert.Equal(t, http.StatusBadRequest, code, c.query)
		assert.Contains(t, body, c.msg, c.query)
		assert.Contains(t, body, `<form class="filter"`, "the form stays, to fix the filter")
		// showing the value that is wrong, not a default in its place
		q, err := url.ParseQuery(c.query)
		require.NoError(t, err)
		sub := submitted(t, body, `class="filter"`)
		for k, vs := range q {
			if k == "after" || k == "before" {
				continue // the page, not the filter: pressing Filter starts at the first
			}
			assert.Equal(t, vs, sub[k], "%s: the form shows %s", c.query, k)
		}
	}
}

func testEventDetail(t *testing.T, b backend) {
	e := setup(t, b, outboxui.Options{})
	occurred := time.Date(2026, 3, 4, 5, 6, 7, 891000000, time.UTC)
	e.publish(outbox.Event{
		ID: "evt/1?x=y&z", Type: "fails.detail", AggregateType: "invoice", AggregateID: "42",
		IdempotencyKey: "invoice:42", OccurredAt: occurred,
		Headers: map[string]string{"traceparent": "00-abc-def-01"},
		Payload: map[string]any{"email": "someone@example.com", "total": 12},
	})
	e.failWith = "webhook: 500 Internal Server Error\nretry later"
	e.drain()

	code, body := e.get("events?type=fails.detail")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, []string{"evt/1?x=y&z"}, ids(body), "an ID with /, ? and & survives the link")
	code, body = e.get("event?id=" + url.QueryEscape("evt/1?x=y&z"))
	require.Equal(t, http.StatusOK, code, body)
	r := e.row("evt/1?x=y&z")
	for _, want := range []string{
		`<span class="status failed" id="status">failed</span>`,
		`<span id="attempts">1</span> attempt`,
		"webhook: 500 Internal Server Error\nretry later",
		`<td id="type">fails.detail</td>`, "invoice", "42", "invoice:42",
		"2026-03-04 05:06:07.891",                                     // occurred_at, UTC
		r.CreatedAt.UTC().Format("2006-01-02 15:04:05.000"),           // created_at as stored
		"&#34;traceparent&#34;: &#34;00-abc-def-01&#34;",              // headers, pretty-printed
		"hidden (set outboxui.Options.ShowPayloads to show payloads)", // payload hidden by default
	} {
		assert.Contains(t, body, want)
	}
	assert.Contains(t, body, `id="aggregate" href="events?aggregate_type=invoice&amp;aggregate_id=42"`)
	assert.NotContains(t, body, "someone@example.com", "payloads are hidden unless ShowPayloads")
	assert.NotContains(t, body, `id="replay"`, "no action buttons on a read-only dashboard")

	e2 := setup(t, b, outboxui.Options{ShowPayloads: true})
	e2.publish(outbox.Event{ID: "p", Type: "x", Payload: map[string]any{"email": "someone@example.com", "total": 12}})
	_, body = e2.get("event?id=p")
	assert.Contains(t, body, "{\n  &#34;email&#34;: &#34;someone@example.com&#34;,\n  &#34;total&#34;: 12\n}", "pretty-printed")

	code, body = e.get("event?id=nope")
	assert.Equal(t, http.StatusNotFound, code)
	assert.Contains(t, body, "no event with ID &#34;nope&#34;")
}

// testEscaping puts markup in every field an event's author controls.
func testEscaping(t *testing.T, b backend) {
	e := setup(t, b, outboxui.Options{ShowPayloads: true, AllowActions: true})
	const evil = `<script>alert(1)</script>`
	e.publish(outbox.Event{
		ID: `"><script>alert(0)</script>`, Type: "<script>alert(2)</script>", AggregateType: evil, AggregateID: `<img src=x onerror=alert(3)>`,
		IdempotencyKey: evil, Headers: map[string]string{"h": evil},
		// Raw, so the stored text holds the tags, not JSON's \u003c escapes.
		Payload: json.RawMessage(`{"html": "</pre><script>alert(4)</script>"}`),
	})
	e.failWith = "<script>alert(5)</script>"
	e.drain()
	id := `"><script>alert(0)</script>`
	require.Equal(t, outbox.StatusFailed, e.row(id).Status)
	require.Contains(t, e.row(id).Payload, "</pre><script>alert(4)", "the stored payload holds the tags")
	for _, page := range []string{"", "events", "events?status=failed&type=" + url.QueryEscape("<script>alert(2)</script>"), "event?id=" + url.QueryEscape(id)} {
		code, body := e.get(page)
		require.Equal(t, http.StatusOK, code, page)
		assert.NotContains(t, withoutLiveJS(body), "<script", page)
		assert.NotContains(t, body, "<img", page)
		assert.Contains(t, body, "&lt;script&gt;alert(", page)
	}
	// The form echoes an unknown status back, ticked, next to the 400.
	code, body := e.get("events?status=" + url.QueryEscape(`"><script>alert(6)</script>`))
	require.Equal(t, http.StatusBadRequest, code, body)
	assert.NotContains(t, withoutLiveJS(body), "<script")
	assert.Contains(t, body, `value="&#34;&gt;&lt;script&gt;alert(6)&lt;/script&gt;"`)
	_, body = e.get("event?id=" + url.QueryEscape(id))
	for i := range 6 {
		assert.Contains(t, body, "alert("+itoa(i)+")", "field %d is shown, as text", i)
	}
	// The confirmation page echoes the filter back.
	resp := e.post("replay", url.Values{"csrf": {e.token()}, "type": {"<script>alert(2)</script>"}})
	body = readBody(t, resp)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	assert.NotContains(t, body, "<script")
	assert.Contains(t, body, `<span id="confirm-count">1</span>`)
}

// liveJS is the one script element the overview and the list carry: the
// embedded live.js, which the Content-Security-Policy allows ('self', no
// inline script).
const liveJS = `<script src="live.js" defer></script>`

// withoutLiveJS is body without its one live.js element (each page has at
// most one), so that any other <script is a failure to escape.
func withoutLiveJS(body string) string { return strings.Replace(body, liveJS, "", 1) }

func testReadOnly(t *testing.T, b backend) {
	e := setup(t, b, outboxui.Options{})
	seed(e)
	_, body := e.get("events?status=failed")
	assert.NotContains(t, body, "<form method=\"post\"", "no action forms when read-only")
	assert.NotContains(t, body, `name="csrf"`)
	for _, verb := range []string{"replay", "purge"} {
		resp := e.post(verb, url.Values{"id": {"bad-1"}, "confirm": {"yes"}})
		assert.Equal(t, http.StatusForbidden, resp.StatusCode, verb)
		assert.Contains(t, readBody(t, resp), "this dashboard is read-only")
	}
	assert.Equal(t, outbox.StatusFailed, e.row("bad-1").Status, "nothing changed")
}

func testCrossOrigin(t *testing.T, b backend) {
	e := setup(t, b, outboxui.Options{AllowActions: true})
	seed(e)
	tok := e.token()
	form := url.Values{"csrf": {tok}, "id": {"bad-1"}, "confirm": {"yes"}, "expect": {"failed:1"}}
	// A browser's cross-site form POST, with a valid token even.
	resp := e.post("replay", form, "Sec-Fetch-Site", "cross-site")
	assert.Equal(t, http.StatusForbidden, resp.StatusCode)
	assert.Contains(t, readBody(t, resp), "cross-origin request refused")
	// An older browser: no Sec-Fetch-Site, an Origin that is not the host.
	resp = e.post("purge", form, "Origin", "https://evil.example")
	assert.Equal(t, http.StatusForbidden, resp.StatusCode)
	// Same origin but without the token, or with another one.
	resp = e.post("replay", url.Values{"id": {"bad-1"}, "confirm": {"yes"}}, "Sec-Fetch-Site", "same-origin")
	assert.Equal(t, http.StatusForbidden, resp.StatusCode)
	assert.Contains(t, readBody(t, resp), "form token")
	resp = e.post("replay", url.Values{"csrf": {strings.Repeat("ab", 32)}, "id": {"bad-1"}, "confirm": {"yes"}})
	assert.Equal(t, http.StatusForbidden, resp.StatusCode)
	assert.Equal(t, outbox.StatusFailed, e.row("bad-1").Status, "nothing changed")
	// GET on an action is not an action.
	code, _ := e.get("replay?id=bad-1&confirm=yes")
	assert.Equal(t, http.StatusMethodNotAllowed, code)
	assert.Equal(t, outbox.StatusFailed, e.row("bad-1").Status)

	// The same request from the same origin goes through.
	resp = e.post("replay", form, "Sec-Fetch-Site", "same-origin")
	assert.Equal(t, http.StatusSeeOther, resp.StatusCode)
	assert.Equal(t, outbox.StatusPending, e.row("bad-1").Status)
}

func testReplayOne(t *testing.T, b backend) {
	e := setup(t, b, outboxui.Options{AllowActions: true})
	seed(e)
	_, body := e.get("event?id=bad-1")
	require.Contains(t, body, `id="replay"`)
	resp := e.post("replay", submitted(t, body, `id="replay"`)) // the page's button, as a browser sends it
	require.Equal(t, http.StatusSeeOther, resp.StatusCode, readBody(t, resp))
	loc := resp.Header.Get("Location")
	assert.Equal(t, "event?id=bad-1", loc, "relative, so the mount prefix stays")
	r := e.row("bad-1")
	assert.Equal(t, outbox.StatusPending, r.Status)
	assert.Equal(t, 0, r.Attempts)
	assert.Equal(t, outbox.StatusFailed, e.row("bad-2").Status, "only the event asked for")

	code, body := e.get(loc)
	require.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, `<p class="flash" role="status" id="flash">Replayed 1 event by 127.0.0.1:`)
	assert.Contains(t, body, `: pending again, due now.</p>`)
	assert.Contains(t, body, `id="status">pending<`)
	_, body = e.get(loc)
	assert.NotContains(t, body, `id="flash"`, "the outcome is shown once")

	e.failWith = "" // the destination is back
	e.drain()
	_, body = e.get("event?id=bad-1")
	assert.Contains(t, body, `id="status">sent<`)

	// Replaying a row that is not failed changes nothing: the counts the
	// form expects (one failed event) are not there, so it asks again.
	resp = e.post("replay", url.Values{"csrf": {e.token()}, "id": {"ok-1"}, "confirm": {"yes"}, "expect": {"failed:1"}})
	body = readBody(t, resp)
	require.Equal(t, http.StatusConflict, resp.StatusCode, body)
	assert.Contains(t, body, `id="confirm-nothing">Nothing to do.<`)
	assert.Equal(t, outbox.StatusSent, e.row("ok-1").Status)

	// A link cannot make a page claim an action: the outcome comes from
	// the server's cookie, not the URL.
	_, body = e.get("events?done=purge&n=1000&by=boss")
	assert.NotContains(t, body, "Purged")
}

func testBulkReplay(t *testing.T, b backend) {
	logs := &syncBuffer{}
	e := setup(t, b, outboxui.Options{AllowActions: true, Logger: slog.New(slog.NewTextHandler(logs, nil))})
	seed(e)
	e.publish(outbox.Event{ID: "bad-3", Type: "fails.card", Payload: "card 4242-4242"})
	e.failWith = "card declined again"
	e.drain()
	tok := e.token()
	_, body := e.get("events?error=declined")
	require.Contains(t, body, `id="bulk-replay"`)
	assert.Contains(t, body, `<input type="hidden" name="error" value="declined">`, "the bulk form carries the filter")

	// Without confirm: a page saying what it would do, and nothing done.
	form := url.Values{"csrf": {tok}, "error": {"declined"}}
	resp := e.post("replay", form)
	body = readBody(t, resp)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	assert.Contains(t, body, `Replay <span id="confirm-count">2</span> failed events where last error contains “declined”?`)
	assert.Equal(t, []string{"bad-1", "bad-3"}, ids(body), "the confirmation lists them")
	assert.Contains(t, body, `<input type="hidden" name="confirm" value="yes">`)
	assert.Equal(t, outbox.StatusFailed, e.row("bad-1").Status, "nothing done before the confirmation")

	resp = e.post("replay", submitted(t, body, `class="confirm"`))
	require.Equal(t, http.StatusSeeOther, resp.StatusCode, readBody(t, resp))
	assert.Equal(t, "events?error=declined", resp.Header.Get("Location"))
	assert.Equal(t, outbox.StatusPending, e.row("bad-1").Status)
	assert.Equal(t, outbox.StatusPending, e.row("bad-3").Status)
	assert.Equal(t, outbox.StatusFailed, e.row("bad-2").Status, "not matched")
	assert.Equal(t, outbox.StatusSent, e.row("ok-1").Status)
	assert.Contains(t, logs.String(), `msg="outboxui: replay" who=127.0.0.1:`, "one record per action, saying who")
	assert.Regexp(t, `msg="outboxui: replay" who=127\.0\.0\.1:\d+ action=replay scope=filter filter="error contains=declined" events=2 remote_addr=`, logs.String())
	assert.NotContains(t, logs.String(), "4242", "never payloads")

	// A filter for sent events only has nothing to replay.
	resp = e.post("replay", url.Values{"csrf": {tok}, "status": {"sent"}})
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
	assert.Contains(t, readBody(t, resp), "replay touches only failed events")
}

func testPurge(t *testing.T, b backend) {
	e := setup(t, b, outboxui.Options{AllowActions: true})
	seed(e)
	tok := e.token()

	// Pending events are never purged.
	resp := e.post("purge", url.Values{"csrf": {tok}, "status": {"pending"}, "confirm": {"yes"}})
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
	assert.Contains(t, readBody(t, resp), "purge touches only sent or failed events")

	// One failed event from its page: confirmation first.
	resp = e.post("purge", url.Values{"csrf": {tok}, "id": {"bad-2"}})
	body := readBody(t, resp)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	assert.Contains(t, body, `Purge <span id="confirm-count">1</span> sent or failed event where ID is bad-2?`)
	resp = e.post("purge", submitted(t, body, `class="confirm"`))
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	assert.Equal(t, "events", resp.Header.Get("Location"))
	_, flash := e.follow(resp)
	assert.Contains(t, flash, `>Purged 1 event by 127.0.0.1:`)
	_, err := e.ob.Get(e.db.WithContext(t.Context()), "bad-2")
	require.ErrorIs(t, err, outbox.ErrNotFound)

	// Sent events older than an hour; the pending and newer ones stay.
	e.backdate("ok-1", time.Now().Add(-2*time.Hour))
	e.backdate("new-1", time.Now().Add(-2*time.Hour))
	// The confirmation fixes "an hour ago" to the time it counted with.
	resp = e.post("purge", url.Values{"csrf": {tok}, "status": {"sent"}, "until": {"1h"}})
	body = readBody(t, resp)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	assert.Contains(t, body, `<span id="confirm-count">1</span>`)
	m := regexp.MustCompile(`name="until" value="([^"]+)"`).FindStringSubmatch(body)
	require.NotNil(t, m, body)
	until, err := time.Parse(time.RFC3339Nano, m[1])
	require.NoError(t, err)
	assert.WithinDuration(t, time.Now().Add(-time.Hour), until, time.Minute)
	resp = e.post("purge", submitted(t, body, `class="confirm"`))
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	_, flash = e.follow(resp)
	assert.Contains(t, flash, `>Purged 1 event by `)
	_, err = e.ob.Get(e.db.WithContext(t.Context()), "ok-1")
	require.ErrorIs(t, err, outbox.ErrNotFound)
	for _, id := range []string{"ok-2", "bad-1", "new-1", "new-2"} {
		_, err := e.ob.Get(e.db.WithContext(t.Context()), id)
		assert.NoError(t, err, id)
	}

	// No status: both sent and failed, pending untouched.
	resp = e.post("purge", url.Values{"csrf": {tok}, "confirm": {"yes"}, "expect": {"sent:1", "failed:1"}})
	require.Equal(t, http.StatusSeeOther, resp.StatusCode, readBody(t, resp))
	_, flash = e.follow(resp)
	assert.Contains(t, flash, `>Purged 2 events by `)
	n, err := e.ob.Count(e.db.WithContext(t.Context()), outbox.Filter{})
	require.NoError(t, err)
	assert.EqualValues(t, 2, n)
	st, err := e.ob.Stats(e.db.WithContext(t.Context()))
	require.NoError(t, err)
	assert.EqualValues(t, 2, st.Pending)
}

// testBulkScope checks that each bulk button says what it will act on
// under the list's filter (statuses it touches, how many, the other
// terms), is disabled saying why when it can touch nothing, and that its
// confirmation and the action itself keep to that.
func testBulkScope(t *testing.T, b backend) {
	e := setup(t, b, outboxui.Options{AllowActions: true})
	seed(e)
	type want struct{ text, why string } // why: "" when the button acts
	for _, c := range []struct {
		query          string
		replay, purge  want
		replayConfirms string // the confirmation's heading when not the button's
	}{
		{"", want{"Replay 2 failed events…", ""}, want{"Purge 4 sent and failed events…", ""}, ""},
		{"status=failed", want{"Replay 2 failed events…", ""}, want{"Purge 2 failed events…", ""}, ""},
		{"status=failed,pending&limit=8", want{"Replay 2 failed events…", ""}, want{"Purge 2 failed events…", ""}, ""},
		{"status=sent", want{"Replay", "replay touches only failed events; this filter asks for sent"},
			want{"Purge 2 sent events…", ""}, ""},
		{"status=pending", want{"Replay", "replay touches only failed events; this filter asks for pending"},
			want{"Purge", "purge touches only sent or failed events; this filter asks for pending"}, ""},
		{"status=sent,pending", want{"Replay", "replay touches only failed events; this filter asks for pending, sent"},
			want{"Purge 2 sent events…", ""}, ""},
		{"error=declined", want{"Replay 1 failed event where last error contains “declined”…", ""},
			want{"Purge 1 sent or failed event where last error contains “declined”…", ""}, ""},
		{"type=order.created", want{"Replay 0 failed events where type is order.created", "no failed event matches this filter"},
			want{"Purge 1 sent or failed event where type is order.created…", ""}, ""},
		{"type=order.paid,+fails.mail", want{"Replay 1 failed event where type is one of order.paid, fails.mail…", ""},
			want{"Purge 2 sent and failed events where type is one of order.paid, fails.mail…", ""}, ""},
		{"id=bad-1&id=ok-1&id=new-1", want{"Replay 1 failed event where ID is one of bad-1, ok-1, new-1…", ""},
			want{"Purge 2 sent and failed events where ID is one of bad-1, ok-1, new-1…", ""}, ""},
		{"aggregate_type=payment&aggregate_id=9&since=1h&until=2099-01-02", want{"Replay 1 failed event where aggregate type is payment; " +
			"aggregate ID is 9; created in the last 1h; created before 2099-01-02…", ""},
			want{"Purge 1 sent or failed event where aggregate type is payment; aggregate ID is 9; created in the last 1h; created before 2099-01-02…", ""},
			// the age fixed to the time it counted from
			`Replay 1 failed event where aggregate type is payment; aggregate ID is 9; created at or after 20\d\d-\d\d-\d\dT[0-9:.]+Z; created before 2099-01-02T00:00:00Z\?`},
	} {
		code, body := e.get("events?" + c.query)
		require.Equal(t, http.StatusOK, code, "%s: %s", c.query, body)
		for verb, w := range map[string]want{"replay": c.replay, "purge": c.purge} {
			text, disabled, why := bulkButton(t, body, verb)
			assert.Equal(t, w.text, text, "%s: the %s button", c.query, verb)
			assert.Equal(t, w.why != "", disabled, "%s: the %s button is disabled", c.query, verb)
			assert.Equal(t, w.why, why, "%s: why %s is disabled", c.query, verb)
			if disabled {
				assert.NotContains(t, body, `id="bulk-`+verb+`-form"`, "%s: no %s form to submit", c.query, verb)
				continue
			}
			// Its form, sent as the browser would, asks to confirm exactly that.
			resp := e.post(verb, submitted(t, body, `id="bulk-`+verb+`-form"`))
			confirm := readBody(t, resp)
			require.Equal(t, http.StatusOK, resp.StatusCode, confirm)
			heading := textOf(between(confirm, `<h1 id="confirm-scope">`, `</h1>`))
			if verb == "replay" && c.replayConfirms != "" {
				assert.Regexp(t, "^"+c.replayConfirms+"$", heading, c.query)
			} else if !strings.Contains(c.query, "since=1h") {
				assert.Equal(t, strings.TrimSuffix(w.text, "…")+"?", heading, "%s: the %s confirmation", c.query, verb)
			}
		}
	}

	// The list: the confirmations say which statuses are left alone.
	_, body := e.get("events?status=failed,pending&limit=8")
	resp := e.post("replay", submitted(t, body, `id="bulk-replay-form"`))
	confirm := readBody(t, resp)
	assert.Equal(t, "The filter also asks for pending events: only failed events can be replayed, so they are left alone.",
		textOf(between(confirm, `<p class="note" id="confirm-left">`, `</p>`)))
	assert.Contains(t, confirm, `<dt>status</dt><dd>failed</dd>`, "the status it touches, not the filter's")
	assert.Contains(t, confirm, `No other filter: every failed event in the table.`)
	resp = e.post("purge", submitted(t, body, `id="bulk-purge-form"`))
	confirm = readBody(t, resp)
	assert.Equal(t, "The filter also asks for pending events: pending events are never purged, so they are left alone.",
		textOf(between(confirm, `<p class="note" id="confirm-left">`, `</p>`)))

	// Acting through the forms touches what the button said and no more:
	// replay from the list, then its purge has nothing left.
	resp = e.post("replay", submitted(t, body, `id="bulk-replay-form"`))
	confirm = readBody(t, resp)
	resp = e.post("replay", submitted(t, confirm, `class="confirm"`))
	require.Equal(t, http.StatusSeeOther, resp.StatusCode, readBody(t, resp))
	assert.Equal(t, "events?limit=8&status=pending%2Cfailed", resp.Header.Get("Location"), "back to the list it came from")
	for id, st := range map[string]outbox.Status{"bad-1": outbox.StatusPending, "bad-2": outbox.StatusPending,
		"ok-1": outbox.StatusSent, "ok-2": outbox.StatusSent, "new-1": outbox.StatusPending, "new-2": outbox.StatusPending} {
		assert.Equal(t, st, e.row(id).Status, id)
	}
	_, body = e.follow(resp)
	assert.Contains(t, body, `>Replayed 2 events by `)
	text, disabled, why := bulkButton(t, body, "purge")
	assert.Equal(t, "Purge 0 failed events", text)
	assert.True(t, disabled)
	assert.Equal(t, "no failed event matches this filter", why)
	// Purge of sent events deletes the two the button counted.
	_, body = e.get("events?status=sent")
	text, _, _ = bulkButton(t, body, "purge")
	require.Equal(t, "Purge 2 sent events…", text)
	resp = e.post("purge", submitted(t, body, `id="bulk-purge-form"`))
	confirm = readBody(t, resp)
	resp = e.post("purge", submitted(t, confirm, `class="confirm"`))
	require.Equal(t, http.StatusSeeOther, resp.StatusCode, readBody(t, resp))
	_, body = e.follow(resp)
	assert.Contains(t, body, `>Purged 2 events by `)
	n, err := e.ob.Count(e.db.WithContext(t.Context()), outbox.Filter{})
	require.NoError(t, err)
	assert.EqualValues(t, 4, n, "the pending four stay")
}

// bulkButton reads a bulk button of the list: its text, whether it is
// disabled, and the reason shown next to it.
func bulkButton(t testing.TB, body, verb string) (text string, disabled bool, why string) {
	t.Helper()
	m := regexp.MustCompile(`<button ([^>]*)id="bulk-` + verb + `"([^>]*)>([^<]*)</button>`).FindStringSubmatch(body)
	require.NotNil(t, m, "no %s button", verb)
	disabled = strings.Contains(m[1]+m[2], "disabled")
	return textOf(m[3]), disabled, textOf(between(body, `<span class="why" id="bulk-`+verb+`-why">`, `</span>`))
}

var tagsRE = regexp.MustCompile(`<[^>]*>`)

// textOf is markup as the reader sees it: tags dropped, entities decoded,
// whitespace collapsed.
func textOf(s string) string {
	return strings.Join(strings.Fields(html.UnescapeString(tagsRE.ReplaceAllString(s, ""))), " ")
}

// testMountedWithoutStrip mounts the handler as the issue shows it, with
// no StripPrefix, and at the root.
func testMountedWithoutStrip(t *testing.T, b backend) {
	e := setup(t, b, outboxui.Options{AllowActions: true})
	seed(e)
	for _, mount := range []string{"/admin/outbox/", "/"} {
		mux := http.NewServeMux()
		mux.Handle(mount, outboxui.Handler(e.db, e.ob, outboxui.Options{}))
		srv := httptest.NewServer(mux)
		defer srv.Close()
		for _, page := range []string{"", "events?status=failed", "event?id=bad-1", "style.css"} {
			resp, err := http.Get(srv.URL + mount + page)
			require.NoError(t, err)
			body := readBody(t, resp)
			resp.Body.Close()
			assert.Equal(t, http.StatusOK, resp.StatusCode, "%s%s", mount, page)
			if page != "style.css" {
				assert.Contains(t, body, `<link rel="stylesheet" href="style.css">`, "relative links")
				assert.NotContains(t, body, `href="/`, "no absolute link that would miss the prefix")
			}
		}
	}
}

func testRoutesAndHeaders(t *testing.T, b backend) {
	e := setup(t, b, outboxui.Options{})
	resp, err := e.client.Get(e.base)
	require.NoError(t, err)
	defer resp.Body.Close()
	assert.Equal(t, "text/html; charset=utf-8", resp.Header.Get("Content-Type"))
	assert.Contains(t, resp.Header.Get("Content-Security-Policy"), "default-src 'none'")
	assert.Contains(t, resp.Header.Get("Content-Security-Policy"), "frame-ancestors 'none'")
	assert.Equal(t, "nosniff", resp.Header.Get("X-Content-Type-Options"))
	assert.Equal(t, "no-store", resp.Header.Get("Cache-Control"))

	code, _ := e.get("nothing-here")
	assert.Equal(t, http.StatusNotFound, code)
	code, css := e.get("style.css")
	assert.Equal(t, http.StatusOK, code)
	assert.Contains(t, css, "font")

	req, err := http.NewRequest(http.MethodHead, e.base+"events", nil)
	require.NoError(t, err)
	resp, err = e.client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	req, err = http.NewRequest(http.MethodDelete, e.base+"events", nil)
	require.NoError(t, err)
	resp, err = e.client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	assert.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)
	assert.Equal(t, "GET, HEAD", resp.Header.Get("Allow"))
}

func testNilOutbox(t *testing.T, b backend) {
	e := setup(t, b, outboxui.Options{})
	seed(e)
	srv := httptest.NewServer(outboxui.Handler(e.db, nil, outboxui.Options{}))
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/events?status=failed")
	require.NoError(t, err)
	body := readBody(t, resp)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, []string{"bad-2", "bad-1"}, ids(body))

	// Memory mode keeps no table: the page says so.
	mem := b.open(t)
	memOb := outbox.Plugin(outbox.Config{Mode: outbox.Memory})
	require.NoError(t, mem.Use(memOb))
	srvMem := httptest.NewServer(outboxui.Handler(mem, memOb, outboxui.Options{}))
	defer srvMem.Close()
	resp, err = http.Get(srvMem.URL + "/events")
	require.NoError(t, err)
	body = readBody(t, resp)
	resp.Body.Close()
	assert.Equal(t, http.StatusInternalServerError, resp.StatusCode)
	assert.Contains(t, body, "operation needs Persistent mode")

	bare := b.open(t) // no plugin installed
	srv2 := httptest.NewServer(outboxui.Handler(bare, nil, outboxui.Options{}))
	defer srv2.Close()
	resp, err = http.Get(srv2.URL + "/")
	require.NoError(t, err)
	body = readBody(t, resp)
	resp.Body.Close()
	assert.Equal(t, http.StatusInternalServerError, resp.StatusCode)
	assert.Contains(t, body, "plugin not installed")
}

// syncBuffer collects log output written by the server's goroutines.
type syncBuffer struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
