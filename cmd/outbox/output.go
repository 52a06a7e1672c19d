package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"

	"github.com/gorm-outbox/outbox"
)

// jsonRow is a row as --json prints it.
type jsonRow struct {
	Seq            int64           `json:"seq"`
	ID             string          `json:"id"`
	Type           string          `json:"type"`
	AggregateType  string          `json:"aggregate_type"`
	AggregateID    string          `json:"aggregate_id"`
	IdempotencyKey string          `json:"idempotency_key"`
	Status         outbox.Status   `json:"status"`
	Attempts       int             `json:"attempts"`
	LastError      *string         `json:"last_error"`
	AvailableAt    time.Time       `json:"available_at"`
	LockedUntil    *time.Time      `json:"locked_until"`
	OccurredAt     time.Time       `json:"occurred_at"`
	CreatedAt      time.Time       `json:"created_at"`
	UpdatedAt      time.Time       `json:"updated_at"`
	SentAt         *time.Time      `json:"sent_at"`
	Headers        json.RawMessage `json:"headers,omitempty"`
	Payload        json.RawMessage `json:"payload,omitempty"`
}

func toJSON(r outbox.Row, payload bool) jsonRow {
	j := jsonRow{
		Seq: r.Seq, ID: r.ID, Type: r.EventType, AggregateType: r.AggregateType, AggregateID: r.AggregateID,
		IdempotencyKey: r.IdempotencyKey, Status: r.Status, Attempts: r.Attempts, LastError: r.LastError,
		AvailableAt: r.AvailableAt, LockedUntil: r.LockedUntil, OccurredAt: r.OccurredAt, CreatedAt: r.CreatedAt,
		UpdatedAt: r.UpdatedAt, SentAt: r.SentAt,
	}
	if r.Headers != nil {
		j.Headers = rawJSON(*r.Headers)
	}
	if payload {
		j.Payload = rawJSON(r.Payload)
	}
	return j
}

// rawJSON embeds stored JSON as it is, or as a string if it is not valid
// JSON (a row written by hand).
func rawJSON(s string) json.RawMessage {
	if json.Valid([]byte(s)) {
		return json.RawMessage(s)
	}
	b, _ := json.Marshal(s)
	return b
}

// clean makes user data safe to print on a terminal: control characters
// (escape sequences that could rewrite the screen, C1 codes included) and
// bidirectional overrides (which can make text read other than it is) are
// shown as \u escapes. keepNewlines keeps line breaks and tabs.
func clean(s string, keepNewlines bool) string {
	var b strings.Builder
	for _, r := range s {
		if keepNewlines && (r == '\n' || r == '\t') {
			b.WriteRune(r)
			continue
		}
		if unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r) {
			fmt.Fprintf(&b, "\\u%04x", r)
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// oneLine shortens s to its first line, at most n runes.
func oneLine(s string, n int) string {
	s, _, more := strings.Cut(s, "\n")
	r := []rune(s)
	if len(r) > n {
		r, more = r[:n], true
	}
	out := clean(string(r), false)
	if more {
		out += "…"
	}
	return out
}

const timeLayout = "2006-01-02 15:04:05Z"

// withoutID is an error's text without the ID of the event it belongs to:
// "deliver event 0193… to host: 410 Gone" reads "deliver this event to
// host: 410 Gone". IDs under 8 characters are left, as they may be part of
// other words.
func withoutID(text, id string) string {
	if len(id) < 8 || !strings.Contains(text, id) {
		return text
	}
	for _, q := range []string{`"` + id + `"`, id} {
		text = strings.ReplaceAll(text, "event "+q, "this event")
		text = strings.ReplaceAll(text, "events "+q, "this event")
	}
	return strings.ReplaceAll(text, id, "(this event)")
}

func writeTable(w io.Writer, rows []outbox.Row) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SEQ\tID\tSTATUS\tTYPE\tAGGREGATE\tATTEMPTS\tCREATED (UTC)\tLAST ERROR")
	for _, r := range rows {
		agg := ""
		if r.AggregateType != "" || r.AggregateID != "" {
			agg = r.AggregateType + "/" + r.AggregateID
		}
		lastErr := ""
		if r.LastError != nil {
			// The cause leads the text (the core writes it first); the
			// event's own ID, which errors written before that held, is
			// in the ID column already.
			lastErr = oneLine(withoutID(*r.LastError, r.ID), 80)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", r.Seq, oneLine(r.ID, 40), r.Status, oneLine(r.EventType, 40),
			oneLine(agg, 40), r.Attempts, r.CreatedAt.UTC().Format(timeLayout), lastErr)
	}
	return tw.Flush()
}

func optTime(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return t.UTC().Format(time.RFC3339Nano)
}

func writeRow(w io.Writer, r outbox.Row, payload bool) error {
	var b bytes.Buffer
	field := func(name, value string) { fmt.Fprintf(&b, "%-17s %s\n", name+":", value) }
	field("id", clean(r.ID, false))
	field("seq", strconv.FormatInt(r.Seq, 10))
	field("type", clean(r.EventType, false))
	agg := "-"
	if r.AggregateType != "" || r.AggregateID != "" {
		agg = clean(r.AggregateType+"/"+r.AggregateID, false)
	}
	field("aggregate", agg)
	field("idempotency key", clean(r.IdempotencyKey, false))
	field("status", string(r.Status))
	field("attempts", strconv.Itoa(r.Attempts))
	lastErr := "-"
	if r.LastError != nil {
		lastErr = strings.ReplaceAll(clean(*r.LastError, true), "\n", "\n"+strings.Repeat(" ", 18))
	}
	field("last error", lastErr)
	field("occurred at", r.OccurredAt.UTC().Format(time.RFC3339Nano))
	field("created at", r.CreatedAt.UTC().Format(time.RFC3339Nano))
	field("updated at", r.UpdatedAt.UTC().Format(time.RFC3339Nano))
	next := ""
	if now := time.Now(); waiting(r, now) {
		next = " (next attempt, in " + r.AvailableAt.Sub(now).Round(time.Second).String() + "; outbox retry-now " + clean(r.ID, false) + " makes it due now)"
	}
	field("available at", r.AvailableAt.UTC().Format(time.RFC3339Nano)+next)
	field("locked until", optTime(r.LockedUntil))
	field("sent at", optTime(r.SentAt))
	headers := "-"
	if r.Headers != nil {
		headers = clean(*r.Headers, false)
	}
	field("headers", headers)
	if !payload {
		field("payload", fmt.Sprintf("(hidden, %d bytes)", len(r.Payload)))
	} else {
		var pretty bytes.Buffer
		if err := json.Indent(&pretty, []byte(r.Payload), "  ", "  "); err != nil {
			pretty.Reset()
			pretty.WriteString(r.Payload)
		}
		b.WriteString("payload:\n  ")
		b.WriteString(clean(pretty.String(), true))
		b.WriteString("\n")
	}
	_, err := w.Write(b.Bytes())
	return err
}
