package outboxui

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"crypto/subtle"
	"embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
)

// Options configures the dashboard. The zero value is a read-only
// dashboard that hides payloads and logs to slog.Default().
type Options struct {
	// AllowActions enables the replay, retry-now and purge buttons and
	// the POST requests behind them. Defaults to false: read-only, every
	// POST is refused with 403.
	AllowActions bool

	// ShowPayloads shows each event's payload, pretty-printed, on its
	// detail page. Payloads often hold personal data. Defaults to false:
	// only the payload's size is shown.
	ShowPayloads bool

	// Logger receives one Info record per action (what it touched, never
	// payloads) and one Error record per failed database call. Defaults to
	// slog.Default().
	Logger *slog.Logger

	// Title is the heading of every page, to tell one service's dashboard
	// from another's. Defaults to "Outbox".
	Title string

	// Refresh is how often the overview and the list refresh in place (a
	// small embedded script polls the page's live fragment), keeping the
	// filter, the scroll position and anything typed in a form. Defaults
	// to 5 s; negative turns it off. Without JavaScript the pages work as
	// plain links and forms, and say when they were rendered.
	Refresh time.Duration

	// MaxPendingAge is how old the oldest pending event may grow before
	// the overview and the list warn, at the top of the page, that
	// delivery is behind. Defaults to 5 minutes; negative turns that
	// warning off. They also warn, whatever this says, when events are
	// pending and no relay is running.
	MaxPendingAge time.Duration

	// PayloadsHint is what an event's page tells the operator to do to
	// see a payload it hides (without ShowPayloads). Defaults to "set
	// outboxui.Options.ShowPayloads"; the outbox command's dashboard says
	// "restart outbox ui with --show-payloads".
	PayloadsHint string

	// Identity is the embedding service's hook that returns who is acting
	// on a request, for example the user name its authentication
	// middleware put in the request's context. Every action is logged
	// with it, and the page after the action says "by <who>".
	// Defaults to nil: the request's RemoteAddr (the client's address, or
	// a proxy's) stands for who; so it does when the hook returns "".
	Identity func(*http.Request) string
}

const (
	defaultRefresh       = 5 * time.Second
	defaultMaxPendingAge = 5 * time.Minute
	defaultPayloadsHint  = "set outboxui.Options.ShowPayloads"
)

// Handler returns the dashboard of the outbox ob installed on db. ob may be
// nil: then the outbox installed on db (db.Use(outbox.Plugin(...))) is
// used, and every request fails with [outbox.ErrNotInstalled] when there
// is none. The handler reads the table only with ob's exported functions
// ([outbox.Outbox.List], [outbox.Outbox.Count], [outbox.Outbox.Get],
// [outbox.Outbox.Overview], [outbox.Outbox.History]; the search box finds
// an idempotency key with [outbox.Filter.Keys]; [outbox.Outbox.Stats] for
// the relays and the warnings), with no SQL of its own, and acts with
// [outbox.Outbox.Replay], [outbox.Outbox.RetryNow] and
// [outbox.Outbox.Purge], as the outbox command does. Each request's context governs its database calls.
//
// Mount it at a path ending in a slash, behind the service's
// authentication:
//
//	mux.Handle("/outbox/", outboxui.Handler(db, ob, outboxui.Options{}))
func Handler(db *gorm.DB, ob *outbox.Outbox, opts Options) http.Handler {
	if ob == nil {
		ob, _ = db.Config.Plugins["outbox"].(*outbox.Outbox)
	}
	h := &handler{
		db:     db,
		ob:     ob,
		opts:   opts,
		title:  cmp.Or(opts.Title, "Outbox"),
		logger: cmp.Or(opts.Logger, slog.Default()),
		pages:  parsePages(),
		now:    time.Now,
	}
	h.refresh = cmp.Or(opts.Refresh, defaultRefresh)
	h.maxAge = cmp.Or(opts.MaxPendingAge, defaultMaxPendingAge)
	h.payloadsHint = cmp.Or(opts.PayloadsHint, defaultPayloadsHint)
	cop := http.NewCrossOriginProtection()
	cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.logger.Warn("outboxui: cross-origin request refused",
			slog.String("method", r.Method), slog.String("path", r.URL.Path),
			slog.String("origin", r.Header.Get("Origin")), slog.String("remote_addr", r.RemoteAddr))
		h.fail(w, r, http.StatusForbidden, errors.New("cross-origin request refused"))
	}))
	return securityHeaders(cop.Handler(h))
}

//go:embed templates/*.html static/*
var files embed.FS

// securityHeaders forbids inline and foreign scripts, plugins and framing
// (the one script is the embedded live.js, so an escaping bug cannot run
// code), and caching of event data.
func securityHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hd := w.Header()
		hd.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; connect-src 'self'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
		hd.Set("X-Content-Type-Options", "nosniff")
		hd.Set("X-Frame-Options", "DENY")
		hd.Set("Referrer-Policy", "same-origin")
		hd.Set("Cache-Control", "no-store")
		next.ServeHTTP(w, r)
	})
}

type handler struct {
	db     *gorm.DB
	ob     *outbox.Outbox
	opts   Options
	title  string
	logger *slog.Logger
	pages  map[string]*template.Template
	now    func() time.Time
	// refresh is Options.Refresh with its default; <= 0 is off.
	refresh time.Duration
	// maxAge is Options.MaxPendingAge with its default; <= 0 is off.
	maxAge       time.Duration
	payloadsHint string
}

// csrfCookie holds the double-submit token. It has no Path, so the browser
// scopes it to the directory the dashboard is mounted at.
const csrfCookie = "outboxui_csrf"

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// Routing by the last path element makes the handler work under any
	// prefix, stripped or not: all pages are siblings.
	page := r.URL.Path[strings.LastIndexByte(r.URL.Path, '/')+1:]
	switch page {
	case "", "events", "event":
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			h.fail(w, r, http.StatusMethodNotAllowed, errors.New("method not allowed"))
			return
		}
	case "replay", "retry", "purge":
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", "POST")
			h.fail(w, r, http.StatusMethodNotAllowed, errors.New("method not allowed"))
			return
		}
	case "style.css", "live.js", "overview.css":
		body, _ := files.ReadFile("static/" + page)
		ct := "text/css; charset=utf-8"
		if strings.HasSuffix(page, ".js") {
			ct = "text/javascript; charset=utf-8"
		}
		w.Header().Set("Content-Type", ct)
		w.Header().Set("Cache-Control", "max-age=3600")
		_, _ = w.Write(body)
		return
	default:
		h.fail(w, r, http.StatusNotFound, errors.New("no such page"))
		return
	}
	if h.ob == nil {
		h.fail(w, r, http.StatusInternalServerError, outbox.ErrNotInstalled)
		return
	}
	switch page {
	case "":
		h.overview(w, r)
	case "events":
		h.list(w, r)
	case "event":
		h.event(w, r)
	default:
		h.action(w, r, page)
	}
}

// base is what every page's layout reads.
type base struct {
	Title        string
	Page         string
	AllowActions bool
	ShowPayloads bool
	CSRF         string
	Flash        string
	Error        string
	// RefreshMS is how often the page refreshes in place, in
	// milliseconds; 0 on pages that do not.
	RefreshMS int64
	// Rendered is when the page was rendered, for "as of" without script.
	Rendered time.Time
}

func (h *handler) base(w http.ResponseWriter, r *http.Request, page string) base {
	b := base{Title: h.title, Page: page, AllowActions: h.opts.AllowActions, ShowPayloads: h.opts.ShowPayloads, Rendered: h.now()}
	if h.opts.AllowActions {
		b.CSRF = h.csrfToken(w, r)
	}
	b.Flash = h.takeFlash(w, r)
	return b
}

// live makes b a page that refreshes in place.
func (h *handler) live(b base) base {
	if h.refresh > 0 {
		b.RefreshMS = h.refresh.Milliseconds()
	}
	return b
}

// csrfToken returns the browser's token, setting a new one when it has
// none. A cross-site form cannot read the cookie, so cannot echo it.
func (h *handler) csrfToken(w http.ResponseWriter, r *http.Request) string {
	if c, err := r.Cookie(csrfCookie); err == nil && len(c.Value) == 64 {
		if _, err := hex.DecodeString(c.Value); err == nil {
			return c.Value
		}
	}
	tok := hex.EncodeToString(randomBytes(32))
	http.SetCookie(w, &http.Cookie{
		Name: csrfCookie, Value: tok, HttpOnly: true, Secure: r.TLS != nil,
		SameSite: http.SameSiteStrictMode,
	})
	return tok
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.Read(b) // never fails (crypto/rand panics instead)
	return b
}

func (h *handler) checkCSRF(r *http.Request) error {
	c, err := r.Cookie(csrfCookie)
	form := r.PostFormValue("csrf")
	if err != nil || c.Value == "" || form == "" ||
		subtle.ConstantTimeCompare([]byte(c.Value), []byte(form)) != 1 {
		return errors.New("missing or wrong form token: reload the page and try again")
	}
	return nil
}

// listPage is the list's template data.
type listPage struct {
	base
	Form    form
	Search  search
	Chips   []chip
	Rows    []outbox.Row
	Total   int64
	Newest  bool
	From    int64  // the cursor: the seq this page is next to, 0 on the first page
	Back    bool   // the page was reached backwards (Previous)
	Next    string // the next page's URL, "" on the last page
	Prev    string // the previous page's URL, "" on the first page
	First   string // the first page's URL, "" on the first page
	Hidden  []field
	Choices []choice
	Bulk    []bulkAction
	// Here is this page's URL, cursor included: where an action started
	// here sends the browser back to.
	Here string
	// Pick: the rows have checkboxes, for an action on the ticked ones.
	Pick bool
	// Health is what the warning at the top says.
	Health health
}

// bulkAction is one of the list's bulk buttons.
type bulkAction struct {
	Verb string // replay, retry or purge
	Text string // the button: what it does to which events, how many
	Why  string // why it cannot run here; "" when it can
}

// The actions, in the order the pages offer them.
var verbs = []string{"replay", "retry", "purge"}

// scope is what an action will act on: Count events of Statuses (those
// of the filter's the action can touch) matching Where.
type scope struct {
	Verb     string
	Count    int64
	Statuses []outbox.Status
	Where    string
	// Unsure: Count is not known (a retry over more pending events than
	// the list reads to count them); the confirmation counts them all.
	Unsure bool
}

func (s scope) Action() string {
	switch s.Verb {
	case "replay":
		return "Replay"
	case "retry":
		return "Retry now"
	}
	return "Purge"
}

// Events is the statuses and the noun for Count: "failed events",
// "pending events waiting for a retry".
func (s scope) Events() string {
	out := statusWords(s.Statuses, s.Count) + " " + plural(int(s.Count), "event", "events")
	if s.Verb == "retry" {
		out += " waiting for a retry"
	}
	return out
}

// Kind is the statuses and the noun for one of them: "sent or failed
// event".
func (s scope) Kind() string {
	out := statusWords(s.Statuses, 1) + " event"
	if s.Verb == "retry" {
		out += " waiting for a retry"
	}
	return out
}

// String is the action in a sentence without its final mark:
// "Replay 2 failed events where type is order.paid".
func (s scope) String() string {
	out := fmt.Sprintf("%s %d %s", s.Action(), s.Count, s.Events())
	if s.Unsure {
		out = fmt.Sprintf("%s the %s", s.Action(), s.Events())
	}
	if s.Where != "" {
		out += " where " + s.Where
	}
	return out
}

// actionStatuses are the statuses an action can touch: replay puts
// failed events back, retry now makes pending ones due, purge never
// deletes pending ones.
func actionStatuses(verb string) []outbox.Status {
	switch verb {
	case "replay":
		return []outbox.Status{outbox.StatusFailed}
	case "retry":
		return []outbox.Status{outbox.StatusPending}
	}
	return []outbox.Status{outbox.StatusSent, outbox.StatusFailed}
}

// verbName is the action as its refusals name it.
func verbName(verb string) string {
	if verb == "retry" {
		return "retry now"
	}
	return verb
}

// refusal says why an action has nothing it may touch under a filter
// whose statuses are asked.
func refusal(verb string, asked []string) string {
	return fmt.Sprintf("%s touches only %s events; this filter asks for %s",
		verbName(verb), strings.Join(strs(actionStatuses(verb)), " or "), strings.Join(asked, ", "))
}

// listScan is how many pending events the list reads, at most, to count
// those a retry would make due (no filter of the core's selects them:
// the list reads the pending rows and looks at each one's next attempt).
// The confirmation reads them all.
const listScan = 1000

// bulk says what a bulk action of the list would act on under the list's
// filter f: the same filter its form carries.
func (h *handler) bulk(ctx context.Context, db *gorm.DB, verb string, fm form, f outbox.Filter, total int64) (bulkAction, error) {
	a := bulkAction{Verb: verb}
	rf, ok := restrict(f, actionStatuses(verb))
	if !ok {
		a.Text = scope{Verb: verb}.Action()
		a.Why = refusal(verb, fm.Statuses)
		return a, nil
	}
	sc := scope{Verb: verb, Count: total, Statuses: rf.Statuses, Where: fm.where()}
	// The list's count is the action's when the filter names only statuses
	// the action touches; otherwise count what it would.
	if len(f.Statuses) == 0 || len(rf.Statuses) < len(f.Statuses) {
		var err error
		if sc.Count, err = h.ob.Count(db.WithContext(ctx), rf); err != nil {
			return a, err
		}
	}
	if verb == "retry" && sc.Count > 0 {
		pending := sc.Count
		w, err := h.scanWaiting(db.WithContext(ctx), rf, listScan)
		if err != nil {
			return a, err
		}
		sc.Count = w.n
		if !w.complete {
			sc.Unsure = true
			a.Text = sc.String() + " (of " + thousands(pending) + " pending)…"
			return a, nil
		}
		if w.n == 0 {
			a.Text = sc.String()
			a.Why = "no " + sc.Kind() + " matches this filter: " + thousands(pending) + " pending, due already or being delivered"
			return a, nil
		}
	}
	a.Text = sc.String()
	if sc.Count == 0 {
		a.Why = "no " + sc.Kind() + " matches this filter"
		return a, nil
	}
	a.Text += "…" // it leads to a confirmation
	return a, nil
}

type field struct{ Name, Value string }

// defaultLimit is the list's page size when the request gives none.
const defaultLimit = 50

func (h *handler) list(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	db := h.db.WithContext(ctx)
	b := h.live(h.base(w, r, "events"))
	lp, err := h.readList(db, r.URL.Query())
	var pg listRows
	if err == nil {
		pg, err = h.readRows(db, lp)
	}
	if err != nil {
		h.listError(w, r, b, lp, err)
		return
	}
	p, err := h.listPage(ctx, db, b, lp, pg)
	if err != nil {
		h.dbError(w, r, "count events", err)
		return
	}
	if p.Health, err = h.readHealth(db); err != nil {
		h.dbError(w, r, "read the table's state", err)
		return
	}
	h.render(w, r, http.StatusOK, "list.html", p)
}

// listParams is the list's request as read: the filter, the page size,
// the cursor and the order.
type listParams struct {
	// raw is the filter as the URL gave it, search text included.
	raw form
	// limitText is the page size as the URL gave it, "" for none: until
	// it is read, the form shows it, so that a 400 about it shows what to
	// fix.
	limitText string
	newest    bool
	// vals is raw with the page size (unless the default) and the order:
	// what every link of the page keeps.
	vals  url.Values
	chips []chip
	// fm is raw with the search text resolved into the field it names:
	// what the page lists, and what its bulk actions act on, is that
	// concrete filter.
	fm     form
	search search
	filter outbox.Filter
	limit  int
	// Paging is keyset on seq, both ways, in either order: after= lists
	// the rows with a greater seq, before= those with a smaller one, each
	// cursor the seq of the row at the page's edge. Rows written meanwhile
	// take greater seqs, so no page shifts under the operator. At most one
	// is set.
	after, before int64
}

// badRequest is a list request the operator must change: a 400, shown on
// the list page with the form as given.
type badRequest struct{ msg string }

func (e badRequest) Error() string { return e.msg }

// dbFailure is a database call of the list that failed: what it did.
type dbFailure struct {
	what string
	err  error
}

func (e dbFailure) Error() string { return e.what + ": " + e.err.Error() }

func (e dbFailure) Unwrap() error { return e.err }

// readList reads the list's request q, resolving its search text. On an
// error, lp holds what was read before it, for the page that shows it: a
// badSearch or badRequest, or a dbFailure.
func (h *handler) readList(db *gorm.DB, q url.Values) (lp listParams, err error) {
	// Newest first unless order=oldest (order=newest, the default, is
	// still read, for the links of older pages and runbooks).
	lp = listParams{raw: readForm(q), limitText: q.Get("limit"), newest: q.Get("order") != "oldest"}
	lp.vals = lp.raw.values()
	if lp.limitText != "" {
		lp.vals.Set("limit", lp.limitText)
	}
	if !lp.newest {
		lp.vals.Set("order", "oldest")
	}
	lp.chips = chips(lp.raw, lp.vals)
	fm, sr, err := h.resolve(db, lp.raw)
	if err != nil {
		if isBadSearch(err) {
			return lp, err
		}
		return lp, dbFailure{"search", err}
	}
	lp.fm, lp.search = fm, sr
	lp.chips = chips(lp.raw, lp.vals, sr)
	if lp.filter, err = lp.fm.filter(h.now()); err != nil {
		return lp, badRequest{err.Error()}
	}
	if lp.limit, err = readLimit(lp.limitText); err != nil {
		return lp, err
	}
	lp.vals.Del("limit")
	if lp.limit != defaultLimit {
		lp.vals.Set("limit", strconv.Itoa(lp.limit))
	}
	lp.after, lp.before, err = readCursor(q)
	return lp, err
}

// readLimit reads the page size s, "" for the default.
func readLimit(s string) (int, error) {
	if s == "" {
		return defaultLimit, nil
	}
	limit, err := strconv.Atoi(s)
	if err != nil || limit < 1 || limit > 1000 {
		return 0, badRequest{fmt.Sprintf("limit %q: want a number from 1 to 1000", s)}
	}
	return limit, nil
}

// readCursor reads the page's cursor: after= or before=, each a row's
// seq, at most one of them.
func readCursor(q url.Values) (after, before int64, err error) {
	for _, c := range []struct {
		name string
		dst  *int64
	}{{"after", &after}, {"before", &before}} {
		if s := q.Get(c.name); s != "" {
			if *c.dst, err = strconv.ParseInt(s, 10, 64); err != nil || *c.dst < 1 {
				return 0, 0, badRequest{fmt.Sprintf("%s %q: want a row's seq", c.name, s)}
			}
		}
	}
	if after > 0 && before > 0 {
		return 0, 0, badRequest{"after and before: give one (a page is next to one row)"}
	}
	return after, before, nil
}

// listError shows why the list cannot be shown: a 400 on the list page,
// as lp was read until then, or the database's error.
func (h *handler) listError(w http.ResponseWriter, r *http.Request, b base, lp listParams, err error) {
	var failed dbFailure
	if errors.As(err, &failed) {
		h.dbError(w, r, failed.what, failed.err)
		return
	}
	p := listPage{base: b, Form: lp.raw, Search: lp.search, Chips: lp.chips, Newest: lp.newest, Choices: lp.raw.statusChoices()}
	p.Form.Limit = lp.limitText
	p.Error = err.Error()
	h.render(w, r, http.StatusBadRequest, "list.html", p)
}

// listRows is the page of rows read for a listParams.
type listRows struct {
	rows  []outbox.Row // in the list's order
	total int64        // the rows the filter matches
	// more: there is a page beyond, in the direction read.
	more bool
	// back: the page was read backwards (Previous).
	back bool
	// after and before are the cursor the page was read at: the
	// request's, or none when reading backwards reached the start.
	after, before int64
}

// readRows reads the page lp asks for, and counts the rows its filter
// matches.
func (h *handler) readRows(db *gorm.DB, lp listParams) (listRows, error) {
	pg := listRows{after: lp.after, before: lp.before}
	// Backwards is against the list's order: read the other way, then turn
	// the page round.
	pg.back = (!lp.newest && lp.before > 0) || (lp.newest && lp.after > 0)
	// One more row than shown tells whether there is a page beyond.
	rows, err := h.ob.List(db, outbox.ListParams{Filter: lp.filter, Limit: lp.limit + 1, Newest: lp.newest != pg.back, AfterSeq: lp.after, BeforeSeq: lp.before})
	if errors.Is(err, outbox.ErrInvalidFilter) {
		return pg, badRequest{err.Error()}
	}
	if err != nil {
		return pg, dbFailure{"list events", err}
	}
	pg.more = len(rows) > lp.limit
	if pg.back && !pg.more {
		// Back at the start: show the first page, full.
		pg.after, pg.before, pg.back = 0, 0, false
		if rows, err = h.ob.List(db, outbox.ListParams{Filter: lp.filter, Limit: lp.limit + 1, Newest: lp.newest}); err != nil {
			return pg, dbFailure{"list events", err}
		}
		pg.more = len(rows) > lp.limit
	}
	if pg.more {
		rows = rows[:lp.limit]
	}
	if pg.back {
		slices.Reverse(rows)
	}
	pg.rows = rows
	if pg.total, err = h.ob.Count(db, lp.filter); err != nil {
		return pg, dbFailure{"count events", err}
	}
	return pg, nil
}

// listPage is the list's template data for the page pg read for lp. Its
// error is the database's, counting what a bulk action would act on.
func (h *handler) listPage(ctx context.Context, db *gorm.DB, b base, lp listParams, pg listRows) (listPage, error) {
	p := listPage{
		base: b, Form: lp.raw, Search: lp.search, Chips: lp.chips, Newest: lp.newest, Choices: lp.raw.statusChoices(),
		Rows: pg.rows, Total: pg.total, From: pg.after + pg.before, Back: pg.back,
		Hidden: hiddenFields(lp.fm),
		Pick:   h.opts.AllowActions && len(pg.rows) > 0,
	}
	p.Form.Limit = strconv.Itoa(lp.limit)
	p.Next, p.Prev, p.First = lp.pageLinks(pg)
	p.Here = lp.here(pg)
	if h.opts.AllowActions && p.Total > 0 {
		for _, verb := range verbs {
			a, err := h.bulk(ctx, db, verb, lp.fm, lp.filter, p.Total)
			if err != nil {
				return p, err
			}
			p.Bulk = append(p.Bulk, a)
		}
	}
	return p, nil
}

// link is the URL of the list lp with the cursor name=seq.
func (lp listParams) link(name string, seq int64) string {
	v := cloneValues(lp.vals)
	v.Set(name, strconv.FormatInt(seq, 10))
	return "events?" + v.Encode()
}

// pageLinks returns the URLs of the pages next to pg and of the first
// page, "" where there is none.
func (lp listParams) pageLinks(pg listRows) (next, prev, first string) {
	// forward and backward are the cursors' names in the list's order.
	forward, backward := "after", "before"
	if lp.newest {
		forward, backward = "before", "after"
	}
	cursor := pg.after + pg.before
	switch {
	case len(pg.rows) > 0:
		if pg.more || pg.back {
			next = lp.link(forward, pg.rows[len(pg.rows)-1].Seq)
		}
		if pg.back || cursor > 0 {
			prev = lp.link(backward, pg.rows[0].Seq)
		}
	case cursor > 0: // past the end: back to the rows before the cursor
		edge := cursor + 1
		if lp.newest {
			edge = cursor - 1
		}
		if edge > 0 {
			prev = lp.link(backward, edge)
		}
	}
	if cursor > 0 {
		first = "events?" + lp.vals.Encode()
	}
	return next, prev, first
}

// here is the URL of the page pg, cursor included: where an action
// started there sends the browser back to.
func (lp listParams) here(pg listRows) string {
	v := cloneValues(lp.vals)
	if pg.after > 0 {
		v.Set("after", strconv.FormatInt(pg.after, 10))
	} else if pg.before > 0 {
		v.Set("before", strconv.FormatInt(pg.before, 10))
	}
	if len(v) == 0 {
		return "events"
	}
	return "events?" + v.Encode()
}

// hiddenFields are the bulk actions' form fields: the resolved filter fm,
// so that they act on what the page lists even if the search text would
// read otherwise by then.
func hiddenFields(fm form) []field {
	var out []field
	hv := fm.values()
	for _, name := range formFields {
		for _, v := range hv[name] {
			out = append(out, field{name, v})
		}
	}
	return out
}

// search is how the list read its search box.
type search struct {
	Text string
	// As is what the text was taken as: "event ID", "idempotency key",
	// "aggregate" or "event type".
	As string
	// Note says more: the event a key belongs to, or that nothing matched.
	Note string
}

// badSearch is a search the operator must change, a 400.
type badSearch struct{ msg string }

func (e badSearch) Error() string { return e.msg }

func isBadSearch(err error) bool {
	var b badSearch
	return errors.As(err, &b)
}

// resolve reads fm's search text (q) as the first of these that matches
// an event: an event ID, an idempotency key, an event type; then, when it
// reads "type:id", an aggregate; else an event type none has yet. It
// returns fm with the text moved into that field, and how it read it.
// The key is looked up with [outbox.Filter.Keys], through the key's unique
// index (docs/schema.md: idempotency_key is NULL when the key is the ID,
// which Get finds first).
func (h *handler) resolve(db *gorm.DB, fm form) (form, search, error) {
	text := fm.Query
	fm.Query = ""
	if text == "" {
		return fm, search{}, nil
	}
	sr := search{Text: text}
	conflict := func(field string) error {
		return badSearch{fmt.Sprintf("the search %q reads as %s, and the %s field is set too: clear one of them", text, sr.As, field)}
	}
	asID := func(id string) (form, search, error) {
		if len(fm.IDs) > 0 {
			return fm, sr, conflict("IDs")
		}
		fm.IDs = []string{id}
		return fm, sr, nil
	}
	if _, err := h.ob.Get(db, text); err == nil {
		sr.As = "event ID"
		return asID(text)
	} else if !errors.Is(err, outbox.ErrNotFound) {
		return fm, sr, err
	}
	keyed, err := h.ob.List(db, outbox.ListParams{Filter: outbox.Filter{Keys: []string{text}}, Limit: 1})
	if err != nil {
		return fm, sr, fmt.Errorf("find idempotency key: %w", err)
	}
	if len(keyed) > 0 {
		sr.As, sr.Note = "idempotency key", "of event "+keyed[0].ID
		return asID(keyed[0].ID)
	}
	asType := func() (form, search, error) {
		if fm.Types != "" {
			return fm, sr, conflict("type")
		}
		fm.Types = text
		return fm, sr, nil
	}
	typed, err := h.ob.List(db, outbox.ListParams{Filter: outbox.Filter{Types: []string{text}}, Limit: 1})
	if err != nil {
		return fm, sr, err
	}
	if len(typed) > 0 {
		sr.As = "event type"
		return asType()
	}
	if typ, id, ok := strings.Cut(text, ":"); ok && strings.TrimSpace(typ) != "" && strings.TrimSpace(id) != "" {
		sr.As = "aggregate"
		if fm.AggregateType != "" || fm.AggregateID != "" {
			return fm, sr, conflict("aggregate")
		}
		fm.AggregateType, fm.AggregateID = strings.TrimSpace(typ), strings.TrimSpace(id)
		return fm, sr, nil
	}
	sr.As, sr.Note = "event type", "no event has this ID, idempotency key or type"
	return asType()
}

// chip is one term of the filter in effect, with the link that drops it.
type chip struct {
	Label  string
	Remove string
}

// chips lists the terms of the list's filter as the URL gave it; vals is
// that filter with the page size and order, which every link keeps.
func chips(fm form, vals url.Values, sr ...search) []chip {
	var out []chip
	drop := func(label, name, value string) {
		v := cloneValues(vals)
		if value == "" {
			v.Del(name)
		} else {
			var keep []string
			for _, x := range v[name] {
				if x != value {
					keep = append(keep, x)
				}
			}
			v[name] = keep
		}
		out = append(out, chip{label, "events?" + v.Encode()})
	}
	if fm.Query != "" {
		label := "search “" + fm.Query + "”"
		if len(sr) > 0 && sr[0].As != "" {
			label += " as " + sr[0].As
			if sr[0].Note != "" {
				label += " (" + sr[0].Note + ")"
			}
		}
		drop(label, "q", "")
	}
	for _, id := range fm.IDs {
		drop("ID "+id, "id", id)
	}
	if len(fm.Statuses) > 0 {
		// status is one comma-separated value in links: drop one status
		// by rewriting it.
		for _, s := range fm.Statuses {
			v := cloneValues(vals)
			rest := slices.DeleteFunc(slices.Clone(fm.Statuses), func(x string) bool { return x == s })
			if len(rest) == 0 {
				v.Del("status")
			} else {
				v.Set("status", strings.Join(rest, ","))
			}
			out = append(out, chip{"status " + s, "events?" + v.Encode()})
		}
	}
	for _, c := range []struct{ label, name, value string }{
		{"type", "type", fm.Types},
		{"aggregate type", "aggregate_type", fm.AggregateType},
		{"aggregate ID", "aggregate_id", fm.AggregateID},
		{"created since", "since", fm.Since},
		{"created until", "until", fm.Until},
		{"error contains", "error", fm.Error},
	} {
		if c.value != "" {
			drop(c.label+" "+c.value, c.name, "")
		}
	}
	return out
}

func cloneValues(v url.Values) url.Values {
	c := url.Values{}
	for k, vs := range v {
		c[k] = slices.Clone(vs)
	}
	return c
}

func (h *handler) event(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	id := r.URL.Query().Get("id")
	row, err := h.ob.Get(h.db.WithContext(ctx).WithContext(ctx), id)
	if errors.Is(err, outbox.ErrNotFound) {
		h.fail(w, r, http.StatusNotFound, fmt.Errorf("no event with ID %q (purged, or never written)", id))
		return
	}
	if err != nil {
		h.dbError(w, r, "read event", err)
		return
	}
	d := struct {
		base
		Row         outbox.Row
		Payload     string
		PayloadSize int
		Headers     string
		// BeforeReplay: the last error predates a replay; Replayed is that
		// replay's history entry, when the history has it.
		BeforeReplay bool
		Replayed     *outbox.HistoryEntry
		// History is the event's failed attempts and replays.
		History []outbox.HistoryEntry
		// Prev and Next are the aggregate's events just before and after
		// this one, by seq; nil when there is none (or no aggregate).
		Prev, Next *outbox.Row
		// HeldBack: an earlier event of the aggregate is not sent yet.
		HeldBack bool
		// NextAttempt is when a pending event in backoff is next
		// attempted; nil when it waits for nothing (Retry now has nothing
		// to do).
		NextAttempt *nextAttempt
		// PayloadsHint says how to show a hidden payload.
		PayloadsHint string
	}{base: h.base(w, r, "event"), Row: row, PayloadSize: len(row.Payload),
		BeforeReplay: errorBeforeReplay(row, h.now()), NextAttempt: nextOf(row), PayloadsHint: h.payloadsHint}
	hist, err := h.ob.History(h.db.WithContext(ctx), id)
	if err != nil {
		h.dbError(w, r, "read the event's history", err)
		return
	}
	d.History = hist
	if n := len(hist); n > 0 && row.LastError != nil && row.Status == outbox.StatusPending {
		// Exact where the history has the replay: the row's error is the
		// one the last entry, a replay, went past.
		last := hist[n-1]
		d.BeforeReplay = last.Outcome == outbox.OutcomeReplayed && last.Error == *row.LastError
		if d.BeforeReplay {
			d.Replayed = &last
		}
	}
	if row.AggregateType != "" || row.AggregateID != "" {
		agg := outbox.Filter{AggregateType: row.AggregateType, AggregateID: row.AggregateID}
		db := h.db.WithContext(ctx)
		prev, err := h.ob.List(db, outbox.ListParams{Filter: agg, BeforeSeq: row.Seq, Newest: true, Limit: 1})
		if err != nil {
			h.dbError(w, r, "read the aggregate's previous event", err)
			return
		}
		next, err := h.ob.List(db, outbox.ListParams{Filter: agg, AfterSeq: row.Seq, Limit: 1})
		if err != nil {
			h.dbError(w, r, "read the aggregate's next event", err)
			return
		}
		if len(prev) > 0 {
			d.Prev = &prev[0]
			d.HeldBack = row.Status == outbox.StatusPending && prev[0].Status != outbox.StatusSent
		}
		if len(next) > 0 {
			d.Next = &next[0]
		}
	}
	if h.opts.ShowPayloads {
		d.Payload = pretty(row.Payload)
	}
	if row.Headers != nil {
		d.Headers = pretty(*row.Headers)
	}
	h.render(w, r, http.StatusOK, "event.html", d)
}

// errorBeforeReplay tells whether row's last error is from before a
// replay. The row keeps no replay mark, so this reads its columns: a
// replay sets a failed row pending with attempts 0 and leaves last_error;
// a failed attempt always leaves attempts at 1 or more (the claim counts
// it before the handler runs), and a delivery clears last_error. So a
// pending row with an error and 0 attempts was replayed since; so is one
// with 1 attempt that is leased now (its first attempt since the replay in
// flight, which has recorded nothing yet). A lease that expired without a
// result (a relay that died) leaves attempts at 1 and is not recognised.
func errorBeforeReplay(row outbox.Row, now time.Time) bool {
	if row.LastError == nil || row.Status != outbox.StatusPending {
		return false
	}
	return row.Attempts == 0 || (row.Attempts == 1 && row.LockedUntil != nil && row.LockedUntil.After(now))
}

func (h *handler) dbError(w http.ResponseWriter, r *http.Request, what string, err error) {
	if errors.Is(err, context.Canceled) && r.Context().Err() != nil {
		return // the client went away
	}
	h.logger.Error("outboxui: "+what, slog.String("error", err.Error()), slog.String("path", r.URL.Path))
	h.fail(w, r, http.StatusInternalServerError, fmt.Errorf("%s: %w", what, err))
}

// fail renders an error page. The message is shown to the operator (who
// is behind the service's authentication) because a database error at
// 3 a.m. is more useful on the page than in a log they must find.
func (h *handler) fail(w http.ResponseWriter, r *http.Request, code int, err error) {
	b := base{Title: h.title, Page: "error", AllowActions: h.opts.AllowActions, Error: err.Error()}
	h.render(w, r, code, "error.html", struct {
		base
		Code int
	}{b, code})
}

func (h *handler) render(w http.ResponseWriter, r *http.Request, code int, page string, data any) {
	var buf bytes.Buffer
	// live=1 asks for the page's live fragment only: what live.js swaps in.
	name := "layout"
	if r.URL.Query().Get("live") == "1" && h.pages[page].Lookup("live") != nil {
		name = "live"
	}
	if err := h.pages[page].ExecuteTemplate(&buf, name, data); err != nil {
		h.logger.Error("outboxui: render", slog.String("page", page), slog.String("error", err.Error()))
		http.Error(w, "outboxui: cannot render the page (see the server log)", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(code)
	if r.Method != http.MethodHead {
		_, _ = w.Write(buf.Bytes())
	}
}

func parsePages() map[string]*template.Template {
	funcs := template.FuncMap{
		"when": when,
		// whensec is a time to the second, for a table cell.
		"whensec": func(t time.Time) string {
			if t.IsZero() {
				return ""
			}
			return t.UTC().Format("2006-01-02 15:04:05")
		},
		"whenp": func(t *time.Time) string { return whenPtr(t) },
		"ago":   func(t time.Time) string { return ago(time.Since(t)) },
		"age":   ago,
		"str":   func(s *string) string { return deref(s) },
		"short": short,
		"last":  func(rows []outbox.Row) int { return len(rows) - 1 },
		"num":   thousands,
		"plural": func(n int64, one, many string) string {
			return plural(int(n), one, many)
		},
		"next":    nextOf,
		"errcell": func(r outbox.Row) *errCell { return errOf(r.ID, r.LastError) },
		"elide":   withoutID,
		// since is how long ago t was, "never" for zero.
		"since": func(t time.Time) string {
			if t.IsZero() {
				return "never"
			}
			return ago(time.Since(t)) + " ago"
		},
	}
	pages := map[string]*template.Template{}
	names, err := fs.Glob(files, "templates/*.html")
	if err != nil {
		panic(err)
	}
	for _, name := range names {
		base := name[len("templates/"):]
		if base == "layout.html" {
			continue
		}
		pages[base] = template.Must(template.New(base).Funcs(funcs).ParseFS(files, "templates/layout.html", name))
	}
	return pages
}

func when(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format("2006-01-02 15:04:05.000")
}

func whenPtr(t *time.Time) string {
	if t == nil {
		return ""
	}
	return when(*t)
}

// ago renders an age to two units, the way an operator reads it.
func ago(d time.Duration) string {
	switch {
	case d < 0:
		return "in " + ago(-d)
	case d < time.Second:
		return "0s"
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dd%02dh", int(d.Hours())/24, int(d.Hours())%24)
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// short cuts s to n runes for a table cell; the detail page has it whole.
func short(n int, s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n]) + "…"
	}
	return s
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// pretty indents JSON; anything else is returned as it is.
func pretty(s string) string {
	var b bytes.Buffer
	if err := json.Indent(&b, []byte(s), "", "  "); err != nil {
		return s
	}
	return b.String()
}
