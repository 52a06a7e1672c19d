package outboxui

import (
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gorm-outbox/outbox"
)

// form is a filter as the operator typed it: the list's query string and
// the actions' hidden fields carry the same names, so a bulk action
// touches exactly what the list showed.
type form struct {
	// Query is the search box's text (q): an event ID, an idempotency key,
	// an aggregate as type:id, or an event type; handler.resolve reads it.
	Query         string
	IDs           []string
	Statuses      []string
	Types         string // comma-separated
	AggregateType string
	AggregateID   string
	Since, Until  string // a time (UTC) or a duration ago
	Error         string
	// Limit is the list's page size as the form shows it: the number in
	// effect, or the text given when it is not one. Not part of the filter.
	Limit string
}

// formFields are the filter's parameter names, in the order they are
// written back into links.
var formFields = []string{"q", "id", "status", "type", "aggregate_type", "aggregate_id", "since", "until", "error"}

func readForm(v url.Values) form {
	f := form{
		Query:         strings.TrimSpace(v.Get("q")),
		Types:         strings.TrimSpace(v.Get("type")),
		AggregateType: strings.TrimSpace(v.Get("aggregate_type")),
		AggregateID:   strings.TrimSpace(v.Get("aggregate_id")),
		Since:         strings.TrimSpace(v.Get("since")),
		Until:         strings.TrimSpace(v.Get("until")),
		Error:         strings.TrimSpace(v.Get("error")),
	}
	for _, id := range v["id"] {
		if id != "" {
			f.IDs = append(f.IDs, id)
		}
	}
	// The list's checkboxes send the status repeated; links and scripts
	// may send a comma-separated list as the command takes, or both.
	for _, s := range v["status"] {
		for part := range strings.SplitSeq(s, ",") {
			if part = strings.TrimSpace(part); part != "" && !slices.Contains(f.Statuses, part) {
				f.Statuses = append(f.Statuses, part)
			}
		}
	}
	// In the checkboxes' order, so that the form sends back the same
	// filter, not the same set in another order; unknown ones stay last
	// for the error to name.
	slices.SortStableFunc(f.Statuses, func(a, b string) int { return statusRank(a) - statusRank(b) })
	return f
}

var statusOrder = []outbox.Status{outbox.StatusPending, outbox.StatusSent, outbox.StatusFailed}

func statusRank(s string) int {
	if i := slices.Index(statusOrder, outbox.Status(s)); i >= 0 {
		return i
	}
	return len(statusOrder)
}

// values is the form as query parameters, empty ones left out.
func (f form) values() url.Values {
	v := url.Values{}
	if f.Query != "" {
		v.Set("q", f.Query)
	}
	for _, id := range f.IDs {
		v.Add("id", id)
	}
	if len(f.Statuses) > 0 {
		v.Set("status", strings.Join(f.Statuses, ","))
	}
	set := func(k, s string) {
		if s != "" {
			v.Set(k, s)
		}
	}
	set("type", f.Types)
	set("aggregate_type", f.AggregateType)
	set("aggregate_id", f.AggregateID)
	set("since", f.Since)
	set("until", f.Until)
	set("error", f.Error)
	return v
}

// choice is one checkbox of the list's form.
type choice struct {
	Value   string
	Checked bool
}

// statusChoices are the status checkboxes: the three statuses, then any
// other status the query named, ticked, so that the form shows (and lets
// the operator untick) the value a 400 complains about instead of
// dropping it.
func (f form) statusChoices() []choice {
	var out []choice
	for _, s := range statusOrder {
		out = append(out, choice{string(s), slices.Contains(f.Statuses, string(s))})
	}
	for _, s := range f.Statuses {
		if !slices.ContainsFunc(out, func(c choice) bool { return c.Value == s }) {
			out = append(out, choice{s, true})
		}
	}
	return out
}

func (f form) isOnlyIDs() bool {
	return len(f.IDs) > 0 && f.Query == "" && len(f.Statuses) == 0 && f.Types == "" && f.AggregateType == "" &&
		f.AggregateID == "" && f.Since == "" && f.Until == "" && f.Error == ""
}

// filter turns the form into the library's Filter; times are UTC and a
// duration means that long before now.
func (f form) filter(now time.Time) (outbox.Filter, error) {
	out := outbox.Filter{
		IDs:           f.IDs,
		AggregateType: f.AggregateType,
		AggregateID:   f.AggregateID,
		ErrorContains: f.Error,
	}
	for _, s := range f.Statuses {
		switch st := outbox.Status(s); st {
		case outbox.StatusPending, outbox.StatusSent, outbox.StatusFailed:
			out.Statuses = append(out.Statuses, st)
		default:
			return out, fmt.Errorf("unknown status %q: want %s, %s or %s", s, outbox.StatusPending, outbox.StatusSent, outbox.StatusFailed)
		}
	}
	for t := range strings.SplitSeq(f.Types, ",") {
		if t = strings.TrimSpace(t); t != "" {
			out.Types = append(out.Types, t)
		}
	}
	var err error
	if out.CreatedSince, err = parseWhen("created since", f.Since, now); err != nil {
		return out, err
	}
	if out.CreatedUntil, err = parseWhen("created until", f.Until, now); err != nil {
		return out, err
	}
	return out, nil
}

var whenLayouts = []string{
	time.RFC3339Nano,
	"2006-01-02T15:04:05",
	"2006-01-02T15:04",
	"2006-01-02 15:04:05",
	"2006-01-02 15:04",
	"2006-01-02",
}

// parseWhen reads a time in UTC, or an age ("90m", "24h", "7d").
func parseWhen(name, s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if d, ok := parseAge(s); ok {
		return now.Add(-d).UTC(), nil
	}
	for _, l := range whenLayouts {
		if t, err := time.ParseInLocation(l, s, time.UTC); err == nil {
			return t.UTC(), nil
		}
	}
	return time.Time{}, fmt.Errorf("%s %q: want a UTC time such as 2026-01-02T15:04 or an age such as 90m, 24h or 7d", name, s)
}

// parseAge reads a Go duration or a number of days ("7d"), as the outbox
// command does.
func parseAge(s string) (time.Duration, bool) {
	if n, ok := strings.CutSuffix(s, "d"); ok {
		days, err := strconv.ParseFloat(n, 64)
		if err != nil || days <= 0 || days > 100000 {
			return 0, false
		}
		return time.Duration(days * float64(24*time.Hour)), true
	}
	d, err := time.ParseDuration(s)
	return d, err == nil && d > 0
}

// describe lists the criteria in words for the confirmation page.
func (f form) describe() []field {
	var out []field
	add := func(name, v string) {
		if v != "" {
			out = append(out, field{name, v})
		}
	}
	add("search", f.Query)
	add("IDs", strings.Join(f.IDs, ", "))
	add("status", strings.Join(f.Statuses, ", "))
	add("type", f.Types)
	add("aggregate type", f.AggregateType)
	add("aggregate ID", f.AggregateID)
	add("created since", f.Since)
	add("created until", f.Until)
	add("error contains", f.Error)
	return out
}

// where is the filter's criteria other than status, in words, for the bulk
// actions to say what they will act on; "" when there are none.
func (f form) where() string {
	var out []string
	oneOf := func(name string, vs []string) {
		switch len(vs) {
		case 0:
		case 1:
			out = append(out, name+" is "+vs[0])
		default:
			out = append(out, name+" is one of "+strings.Join(vs, ", "))
		}
	}
	if f.Query != "" {
		out = append(out, "search is “"+f.Query+"”")
	}
	oneOf("ID", f.IDs)
	var types []string
	for t := range strings.SplitSeq(f.Types, ",") {
		if t = strings.TrimSpace(t); t != "" {
			types = append(types, t)
		}
	}
	oneOf("type", types)
	if f.AggregateType != "" {
		out = append(out, "aggregate type is "+f.AggregateType)
	}
	if f.AggregateID != "" {
		out = append(out, "aggregate ID is "+f.AggregateID)
	}
	// An age reads as one ("in the last 24h"), not as the time it stands
	// for, which the confirmation shows once it is fixed.
	if f.Since != "" {
		if _, ok := parseAge(f.Since); ok {
			out = append(out, "created in the last "+f.Since)
		} else {
			out = append(out, "created at or after "+f.Since)
		}
	}
	if f.Until != "" {
		if _, ok := parseAge(f.Until); ok {
			out = append(out, "created more than "+f.Until+" ago")
		} else {
			out = append(out, "created before "+f.Until)
		}
	}
	if f.Error != "" {
		out = append(out, "last error contains “"+f.Error+"”")
	}
	return strings.Join(out, "; ")
}

// statusWords names statuses for a count of n events: "failed", "sent and
// failed events", "sent or failed event".
func statusWords(statuses []outbox.Status, n int64) string {
	st := strs(statuses)
	slices.SortStableFunc(st, func(a, b string) int { return statusRank(a) - statusRank(b) })
	if len(st) < 2 {
		return strings.Join(st, "")
	}
	conj := " and "
	if n == 1 {
		conj = " or "
	}
	return strings.Join(st[:len(st)-1], ", ") + conj + st[len(st)-1]
}

// strs is ss as plain strings, for joining into text.
func strs[S ~string](ss []S) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = string(s)
	}
	return out
}

// String is the filter for the log: criteria, never event data beyond
// what the core logs itself (IDs, types, aggregates).
func (f form) String() string {
	var b strings.Builder
	for _, c := range f.describe() {
		if b.Len() > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "%s=%s", c.Name, c.Value)
	}
	if b.Len() == 0 {
		return "(all)"
	}
	return b.String()
}
