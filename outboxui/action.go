package outboxui

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
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

// maxSelected is how many events one selection may name: the list's
// largest page.
const maxSelected = 1000

// tally is how many events of one status an action touches or leaves
// alone.
type tally struct {
	// Key names the tally in the confirmation's expect fields: the
	// status, or for a retry "waiting" (pending, waiting for a retry) and
	// "due" (pending, due already or being delivered).
	Key    string
	Status outbox.Status
	N      int64
}

// Tallies of a retry's pending events: those it makes due, those it
// leaves.
const (
	keyWaiting = "waiting"
	keyDue     = "due"
)

// Note says which of its status's events a tally counts, "" when all.
func (t tally) Note() string {
	switch t.Key {
	case keyWaiting:
		return "waiting for a retry"
	case keyDue:
		return "due already, or being delivered"
	}
	return ""
}

// words is the tally's name in a sentence: "failed", "waiting for a
// retry".
func (t tally) words() string {
	if n := t.Note(); n != "" {
		return n
	}
	return string(t.Status)
}

// tallies counts f's matches for each of statuses, one Count each, in
// the list's status order.
func (h *handler) tallies(db *gorm.DB, f outbox.Filter, statuses []outbox.Status) ([]tally, error) {
	st := slices.Clone(statuses)
	slices.SortStableFunc(st, func(a, b outbox.Status) int { return statusRank(string(a)) - statusRank(string(b)) })
	var out []tally
	for _, s := range st {
		g := f
		g.Statuses = []outbox.Status{s}
		n, err := h.ob.Count(db, g)
		if err != nil {
			return nil, fmt.Errorf("count %s events: %w", s, err)
		}
		out = append(out, tally{string(s), s, n})
	}
	return out, nil
}

// waitingRows is what scanWaiting read.
type waitingRows struct {
	n     int64        // the pending events waiting for a retry
	first []outbox.Row // the first 20 of them, by seq
	// pending is how many pending events it read; complete whether it
	// read all that match.
	pending  int64
	complete bool
}

// scanWaiting counts the pending events f matches (f's Statuses pending)
// that wait for a retry, as [outbox.Outbox.RetryNow] would change them
// now. No filter of the core's selects them, so it lists the pending
// rows, by seq, a page of 1000 at a time, and looks at each one's next
// attempt: through the pending rows' index, never the sent ones. It reads
// at most limit rows (0: all of them).
func (h *handler) scanWaiting(db *gorm.DB, f outbox.Filter, limit int) (waitingRows, error) {
	var w waitingRows
	now := h.now()
	var after int64
	for {
		page := maxSelected
		if limit > 0 {
			page = min(page, limit-int(w.pending))
		}
		rows, err := h.ob.List(db, outbox.ListParams{Filter: f, Limit: page, AfterSeq: after})
		if err != nil {
			return w, fmt.Errorf("list pending events: %w", err)
		}
		for _, r := range rows {
			if waiting(r, now) {
				w.n++
				if len(w.first) < 20 {
					w.first = append(w.first, r)
				}
			}
		}
		w.pending += int64(len(rows))
		if len(rows) < page {
			w.complete = true
			return w, nil
		}
		if limit > 0 && int(w.pending) >= limit {
			// Full at the limit: complete only if nothing follows.
			more, err := h.ob.List(db, outbox.ListParams{Filter: f, Limit: 1, AfterSeq: rows[len(rows)-1].Seq})
			if err != nil {
				return w, fmt.Errorf("list pending events: %w", err)
			}
			w.complete = len(more) == 0
			return w, nil
		}
		after = rows[len(rows)-1].Seq
	}
}

// touches counts what verb would touch of rf (f narrowed to the statuses
// verb touches): one tally per status, or for a retry the pending events
// waiting for one, then the first of them (nil for the other actions).
func (h *handler) touches(db *gorm.DB, verb string, rf outbox.Filter) ([]tally, *waitingRows, error) {
	if verb != "retry" {
		ts, err := h.tallies(db, rf, rf.Statuses)
		return ts, nil, err
	}
	w, err := h.scanWaiting(db, rf, 0)
	if err != nil {
		return nil, nil, err
	}
	return []tally{{keyWaiting, outbox.StatusPending, w.n}}, &w, nil
}

// accepts tells whether the counts a confirmation showed (expect) let the
// action run on the counts found now (touch). Replay and purge run only
// on the same counts. A retry runs on as many or fewer, but not none:
// events in backoff become due by themselves (a retry's aim), and a relay
// may deliver them meanwhile; more, another event failed since, is asked
// again.
func accepts(verb string, expect, touch []tally) bool {
	if verb != "retry" {
		return slices.Equal(expect, touch)
	}
	return len(expect) == 1 && len(touch) == 1 && expect[0].Key == touch[0].Key &&
		touch[0].N > 0 && touch[0].N <= expect[0].N
}

func sum(ts []tally) int64 {
	var n int64
	for _, t := range ts {
		n += t.N
	}
	return n
}

// expectOf is a tally as the confirmation's hidden expect fields carry
// it: "failed:312".
func expectOf(ts []tally) []string {
	out := make([]string, len(ts))
	for i, t := range ts {
		out[i] = t.Key + ":" + strconv.FormatInt(t.N, 10)
	}
	return out
}

// readExpect reads the expect fields back; false when one is not a known
// status with a count (a form of someone else's).
func readExpect(vs []string) ([]tally, bool) {
	var out []tally
	for _, v := range vs {
		s, n, ok := strings.Cut(v, ":")
		c, err := strconv.ParseInt(n, 10, 64)
		st := outbox.Status(s)
		if s == keyWaiting {
			st = outbox.StatusPending
		} else if statusRank(s) == len(statusOrder) {
			ok = false
		}
		if !ok || err != nil || c < 0 {
			return nil, false
		}
		out = append(out, tally{s, st, c})
	}
	slices.SortStableFunc(out, func(a, b tally) int { return statusRank(string(a.Status)) - statusRank(string(b.Status)) })
	return out, len(out) > 0
}

// tallyWords says a tally for a sentence: "1,200 sent, 4 failed".
func tallyWords(ts []tally) string {
	var parts []string
	for _, t := range ts {
		parts = append(parts, thousands(t.N)+" "+t.words())
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// thousands writes n with a comma between each group of three digits.
func thousands(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// confirmPage is the confirmation an action shows before it runs: what it
// will do, to how many events of which status, under which filter or
// selection. Only its button (a POST with the form token, the filter or
// the selection, and the counts shown as expect fields) runs it.
type confirmPage struct {
	base
	scope
	// Selected is how many events the operator ticked; 0 when the action
	// is on everything the filter matches.
	Selected int
	// Touch is what the action will touch, per status (the counts the
	// confirmation checks again); Left what else matches and it leaves
	// alone (statuses it never touches), only those with events.
	Touch, Left []tally
	// Gone is how many selected events are no longer in the table.
	Gone int64
	// Asked names the statuses the filter asks for that the action never
	// touches ("pending"), "" when none.
	Asked    string
	Criteria []field
	Hidden   []field
	Expect   []string
	Cancel   string
	Sample   []outbox.Row
	// Changed says what moved since the confirmation the operator
	// answered: it is shown again instead of running.
	Changed string
}

// What is the action in one sentence: "312 failed events where type is
// order.created will be set pending and due now, …", "1,204 events (1,200
// sent, 4 failed) will be deleted."
func (p confirmPage) What() string {
	var touched []tally
	for _, t := range p.Touch {
		if t.N > 0 {
			touched = append(touched, t)
		}
	}
	noun := plural(int(p.Count), "event", "events")
	subject := thousands(p.Count) + " " + noun
	if len(touched) == 1 {
		subject = thousands(p.Count) + " " + string(touched[0].Status) + " " + noun
	}
	switch {
	case p.Selected > 0:
		subject += " of the " + thousands(int64(p.Selected)) + " selected"
	case p.Where != "":
		subject += " where " + p.Where
	}
	if len(touched) > 1 {
		subject += " (" + tallyWords(touched) + ")"
	}
	switch p.Verb {
	case "replay":
		return subject + " will be set pending and due now, with " + plural(int(p.Count), "its", "their") +
			" attempts reset: the relay delivers " + plural(int(p.Count), "it", "them") + " again."
	case "retry":
		return subject + ", waiting for a retry, will be made due now, " + plural(int(p.Count), "its", "their") +
			" attempts kept (MaxAttempts still counts them): the relay attempts " + plural(int(p.Count), "it", "them") +
			" at once instead of after the wait."
	}
	return subject + " will be deleted from the table. This cannot be undone."
}

// Fate says what happens to the events of a tally the action leaves
// alone.
func (p confirmPage) Fate(t tally) string {
	switch {
	case p.Verb == "replay":
		return "left alone: only failed events can be replayed"
	case p.Verb == "retry" && t.Key == keyDue:
		return "left alone: nothing to retry"
	case p.Verb == "retry":
		return "left alone: only pending events wait for a retry"
	}
	return "left alone: pending events are never purged"
}

// Does is what the action does to the events it touches, for the tally
// table.
func (p confirmPage) Does() string {
	switch p.Verb {
	case "replay":
		return "set pending, due now, attempts reset"
	case "retry":
		return "made due now, attempts kept"
	}
	return "deleted"
}

// flashCookie carries the outcome of an action to the page the browser is
// sent to next, which shows it once: set by the server only (HttpOnly,
// SameSite=Strict), so a link cannot make a page claim an action that did
// not happen, or who did it.
const flashCookie = "outboxui_flash"

// flash is an action's outcome.
type flash struct {
	Verb string `json:"v"`
	N    int    `json:"n"`
	By   string `json:"by"`
}

func (f flash) String() string {
	events := thousands(int64(f.N)) + " " + plural(f.N, "event", "events")
	switch f.Verb {
	case "replay":
		return "Replayed " + events + " by " + f.By + ": pending again, due now."
	case "retry":
		return "Retried " + events + " now by " + f.By + ": due now, attempts kept."
	case "purge":
		return "Purged " + events + " by " + f.By + "."
	}
	return ""
}

func setFlash(w http.ResponseWriter, r *http.Request, f flash) {
	b, _ := json.Marshal(f) // a struct of strings and an int: never fails
	http.SetCookie(w, &http.Cookie{
		Name: flashCookie, Value: base64.RawURLEncoding.EncodeToString(b),
		MaxAge: 300, HttpOnly: true, Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode,
	})
}

// takeFlash returns the flash a page shows, once: a GET of a whole page
// reads and clears it, a live fragment leaves it.
func (h *handler) takeFlash(w http.ResponseWriter, r *http.Request) string {
	if r.Method != http.MethodGet || r.URL.Query().Get("live") == "1" {
		return ""
	}
	c, err := r.Cookie(flashCookie)
	if err != nil {
		return ""
	}
	http.SetCookie(w, &http.Cookie{Name: flashCookie, Value: "", MaxAge: -1, HttpOnly: true, Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode})
	b, err := base64.RawURLEncoding.DecodeString(c.Value)
	var f flash
	if err != nil || json.Unmarshal(b, &f) != nil || f.N < 0 {
		return ""
	}
	return f.String()
}

// who is who is acting on r: Options.Identity's answer, else the
// request's RemoteAddr.
func (h *handler) who(r *http.Request) string {
	if h.opts.Identity != nil {
		if s := strings.TrimSpace(h.opts.Identity(r)); s != "" {
			if rs := []rune(s); len(rs) > 200 {
				s = string(rs[:200]) + "…"
			}
			return s
		}
	}
	return r.RemoteAddr
}

// backLink reads the page an action form came from (its back field) and
// writes it again from the parameters it knows, so that the redirect after
// the action stays on the dashboard: the list with its filter, page size,
// order and page, or an event's page. "" when there is none.
func backLink(s string) string {
	if rest, ok := strings.CutPrefix(s, "event?"); ok {
		q, err := url.ParseQuery(rest)
		if err != nil || q.Get("id") == "" {
			return ""
		}
		return "event?" + url.Values{"id": {q.Get("id")}}.Encode()
	}
	rest, ok := strings.CutPrefix(s, "events")
	if !ok || (rest != "" && rest[0] != '?') {
		return ""
	}
	q, err := url.ParseQuery(strings.TrimPrefix(rest, "?"))
	if err != nil {
		return ""
	}
	v := readForm(q).values()
	if n, err := strconv.Atoi(q.Get("limit")); err == nil && n >= 1 && n <= 1000 {
		v.Set("limit", strconv.Itoa(n))
	}
	if q.Get("order") == "oldest" {
		v.Set("order", "oldest")
	}
	for _, name := range []string{"after", "before"} {
		if n, err := strconv.ParseInt(q.Get(name), 10, 64); err == nil && n > 0 {
			v.Set(name, strconv.FormatInt(n, 10))
			break
		}
	}
	if len(v) == 0 {
		return "events"
	}
	return "events?" + v.Encode()
}

// action runs a replay, retry or purge POST on the events the operator ticked
// (scope=selected, the ticked IDs) or on everything a filter matches (the
// list's filter, or one event's ID from its page). It runs only when the
// form says confirm=yes and its expect fields hold the counts per status
// that the action touches now; otherwise it shows the confirmation, saying
// what changed when the counts moved since the one answered.
func (h *handler) action(w http.ResponseWriter, r *http.Request, verb string) {
	if !h.opts.AllowActions {
		h.fail(w, r, http.StatusForbidden, errors.New("this dashboard is read-only (outboxui.Options.AllowActions is false)"))
		return
	}
	if err := r.ParseForm(); err != nil {
		h.fail(w, r, http.StatusBadRequest, fmt.Errorf("read the form: %w", err))
		return
	}
	who := h.who(r)
	if err := h.checkCSRF(r); err != nil {
		h.logger.Warn("outboxui: action refused", slog.String("who", who), slog.String("action", verb),
			slog.String("reason", "form token"), slog.String("remote_addr", r.RemoteAddr))
		h.fail(w, r, http.StatusForbidden, err)
		return
	}
	ctx := r.Context()
	db := h.db.WithContext(ctx)
	selected := r.PostForm.Get("scope") == "selected"
	var fm form
	if selected {
		fm.IDs = readForm(r.PostForm).IDs
		slices.Sort(fm.IDs)
		fm.IDs = slices.Compact(fm.IDs)
		if len(fm.IDs) == 0 {
			h.fail(w, r, http.StatusBadRequest, fmt.Errorf("no event selected: tick the events to %s in the list's first column, or use the buttons for everything the filter matches", verb))
			return
		}
		if len(fm.IDs) > maxSelected {
			h.fail(w, r, http.StatusBadRequest, fmt.Errorf("%d events selected: at most %d at once", len(fm.IDs), maxSelected))
			return
		}
	} else {
		// The list's forms carry the search resolved; a form of another's
		// may carry the text, read here as the list reads it.
		var err error
		if fm, _, err = h.resolve(db, readForm(r.PostForm)); err != nil {
			if isBadSearch(err) {
				h.fail(w, r, http.StatusBadRequest, err)
				return
			}
			h.dbError(w, r, "search", err)
			return
		}
	}
	f, err := fm.filter(h.now())
	if err != nil {
		h.fail(w, r, http.StatusBadRequest, err)
		return
	}
	// Narrow the statuses to those the action can touch, so the count shown
	// is what it will do.
	rf, ok := restrict(f, actionStatuses(verb))
	if !ok {
		h.fail(w, r, http.StatusBadRequest, errors.New(refusal(verb, fm.Statuses)))
		return
	}
	touch, wr, err := h.touches(db, verb, rf)
	if err != nil {
		h.dbError(w, r, "count events", err)
		return
	}
	back := backLink(r.PostForm.Get("back"))
	expect, hasExpect := readExpect(r.PostForm["expect"])
	confirmed := r.PostForm.Get("confirm") == "yes" && hasExpect
	if confirmed && accepts(verb, expect, touch) {
		h.run(w, r, verb, who, fm, rf, selected, back)
		return
	}
	p := confirmPage{base: h.base(w, r, "events"), Selected: len(fm.IDs), Touch: touch, Cancel: back}
	if !selected {
		p.Selected = 0
	}
	code := http.StatusOK
	if confirmed {
		// Someone or something (a relay, another operator) changed the
		// rows since the confirmation was shown: ask again.
		code = http.StatusConflict
		p.Changed = fmt.Sprintf("The events this would touch changed since the confirmation was shown: it counted %s, now %s. Nothing was done: check the numbers below and confirm again.",
			tallyWords(expect), tallyWords(touch))
		h.logger.Info("outboxui: "+verb+" asked again", slog.String("who", who), slog.String("action", verb),
			slog.String("expected", tallyWords(expect)), slog.String("now", tallyWords(touch)), slog.String("remote_addr", r.RemoteAddr))
	}
	if err := h.fillConfirm(db, &p, verb, fm, f, rf, selected, wr); err != nil {
		h.dbError(w, r, "count events", err)
		return
	}
	if p.Cancel == "" {
		p.Cancel = "events?" + fm.values().Encode()
	}
	h.render(w, r, code, "confirm.html", p)
}

// fillConfirm completes the confirmation of verb on rf (f narrowed to the
// statuses verb touches; p.Touch counted): what else matches and is left
// alone, the criteria in words, the first events, and the hidden fields
// that make its button run the same action with the counts shown. wr is
// a retry's reading of the pending events, nil for the other actions.
func (h *handler) fillConfirm(db *gorm.DB, p *confirmPage, verb string, fm form, f, rf outbox.Filter, selected bool, wr *waitingRows) error {
	p.scope = scope{Verb: verb, Count: sum(p.Touch), Statuses: rf.Statuses}
	p.Expect = expectOf(p.Touch)
	left, err := h.leftAlone(db, p, f, rf, wr)
	if err != nil {
		return err
	}
	if selected {
		p.Gone = int64(len(fm.IDs)) - p.Count - sum(left)
	}
	switch {
	case wr != nil:
		p.Sample = wr.first
	case p.Count > 0:
		if p.Sample, err = h.ob.List(db, outbox.ListParams{Filter: rf, Limit: 20}); err != nil {
			return fmt.Errorf("list events: %w", err)
		}
	}
	hidden := []field{{"scope", "filter"}}
	if selected {
		hidden[0].Value = "selected"
		p.Criteria = []field{{"selected", thousands(int64(len(fm.IDs))) + " " + plural(len(fm.IDs), "event", "events") + " ticked on the list"},
			{"IDs", strings.Join(fm.IDs, ", ")},
			{"status", statusWords(rf.Statuses, 2) + " (those " + verbName(verb) + " touches)"}}
		for _, id := range fm.IDs {
			hidden = append(hidden, field{"id", id})
		}
	} else {
		// The confirmed action runs with the times counted here: "1h ago"
		// read again at the confirmation would move.
		frozen := fm
		if !f.CreatedSince.IsZero() {
			frozen.Since = f.CreatedSince.Format(time.RFC3339Nano)
		}
		if !f.CreatedUntil.IsZero() {
			frozen.Until = f.CreatedUntil.Format(time.RFC3339Nano)
		}
		p.Where = frozen.where()
		vals := frozen.values()
		for _, name := range formFields {
			for _, v := range vals[name] {
				hidden = append(hidden, field{name, v})
			}
		}
		// The criteria say which statuses it touches, not which the filter
		// asked for; the tally says what it leaves alone.
		p.Criteria = []field{{"status", statusWords(rf.Statuses, 2)}}
		if verb == "retry" {
			p.Criteria[0].Value += ", waiting for a retry"
		}
		for _, c := range frozen.describe() {
			if c.Name != "status" {
				p.Criteria = append(p.Criteria, c)
			}
		}
	}
	if p.Cancel != "" {
		hidden = append(hidden, field{"back", p.Cancel})
	}
	p.Hidden = hidden
	return nil
}

// leftAlone counts what else the filter (or the selection) f matches that
// the action on rf leaves alone: statuses it never touches, and for a
// retry (wr) the pending events that wait for nothing. It sets p.Asked
// and p.Left (the tallies with events), and returns every tally.
func (h *handler) leftAlone(db *gorm.DB, p *confirmPage, f, rf outbox.Filter, wr *waitingRows) ([]tally, error) {
	asked := f.Statuses
	if len(asked) == 0 {
		asked = statusOrder
	}
	var others []outbox.Status
	for _, s := range asked {
		if !slices.Contains(rf.Statuses, s) {
			others = append(others, s)
		}
	}
	if len(f.Statuses) > 0 {
		p.Asked = strings.Join(strs(others), ", ")
	}
	left, err := h.tallies(db, f, others)
	if err != nil {
		return nil, err
	}
	if wr != nil {
		left = append([]tally{{keyDue, outbox.StatusPending, wr.pending - wr.n}}, left...)
	}
	for _, t := range left {
		if t.N > 0 {
			p.Left = append(p.Left, t)
		}
	}
	return left, nil
}

// run does a confirmed action, logs it with who did it, and sends the
// browser back where the action came from with the outcome to show.
func (h *handler) run(w http.ResponseWriter, r *http.Request, verb, who string, fm form, rf outbox.Filter, selected bool, back string) {
	// Replay and retry write who into each event's history.
	db := h.db.WithContext(outbox.WithActor(r.Context(), who))
	var n int
	var err error
	switch verb {
	case "replay":
		n, err = h.ob.Replay(db, rf)
	case "retry":
		n, err = h.ob.RetryNow(db, rf)
	default:
		n, err = h.ob.Purge(db, rf)
	}
	attrs := []any{slog.String("who", who), slog.String("action", verb)}
	if selected {
		attrs = append(attrs, slog.String("scope", "selection"), slog.Int("selected", len(fm.IDs)))
	} else {
		attrs = append(attrs, slog.String("scope", "filter"), slog.String("filter", fm.String()))
	}
	attrs = append(attrs, slog.Int("events", n), slog.String("remote_addr", r.RemoteAddr))
	if err != nil {
		if errors.Is(err, outbox.ErrInvalidFilter) {
			h.fail(w, r, http.StatusBadRequest, err)
			return
		}
		h.logger.Error("outboxui: "+verb+" failed", append(attrs, slog.String("error", err.Error()))...)
		h.fail(w, r, http.StatusInternalServerError, fmt.Errorf("%s: %w (%d events done before the error)", verb, err, n))
		return
	}
	h.logger.Info("outboxui: "+verb, attrs...)
	setFlash(w, r, flash{Verb: verb, N: n, By: who})
	// A relative Location resolves against the URL the browser sent, which
	// keeps the mount prefix that http.Redirect would lose after StripPrefix.
	loc := back
	switch {
	case verb == "purge" && strings.HasPrefix(loc, "event?"):
		loc = "events" // the event is gone
	case loc != "":
	case verb == "replay" && len(fm.IDs) == 1 && fm.isOnlyIDs():
		loc = "event?" + url.Values{"id": {fm.IDs[0]}}.Encode()
	case fm.isOnlyIDs():
		loc = "events"
	default:
		loc = "events?" + fm.values().Encode()
	}
	w.Header().Set("Location", loc)
	w.WriteHeader(http.StatusSeeOther)
}

// restrict narrows f's statuses to allowed (all of allowed when f has
// none); false when nothing is left.
func restrict(f outbox.Filter, allowed []outbox.Status) (outbox.Filter, bool) {
	if len(f.Statuses) == 0 {
		f.Statuses = allowed
		return f, true
	}
	var keep []outbox.Status
	for _, s := range f.Statuses {
		if slices.Contains(allowed, s) && !slices.Contains(keep, s) {
			keep = append(keep, s)
		}
	}
	f.Statuses = keep
	return f, len(keep) > 0
}
