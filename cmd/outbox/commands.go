package main

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/gorm-outbox/outbox"
)

func isInvalidFilter(err error) bool { return errors.Is(err, outbox.ErrInvalidFilter) }

func isNotFound(err error) bool { return errors.Is(err, outbox.ErrNotFound) }

func (c *cli) stats(ctx context.Context, args []string) error {
	fs := c.flags("stats", "[--max-pending-age D] [--max-failed N] [--max-failed-last-hour N] [--min-relays N] [--max-relay-silence D] [--json]")
	o := c.common(fs)
	var maxAge ageFlag
	fs.Var(&maxAge, "max-pending-age", "check: fail (exit 3) when the oldest pending event is older than `D` (e.g. 5m)")
	maxFailed := fs.Int("max-failed", -1, "check: fail (exit 3) when more than `N` events are failed (default: no check)")
	maxFailedHour := fs.Int("max-failed-last-hour", -1, "check: fail (exit 3) when more than `N` events failed in the last hour (default: no check)")
	minRelays := fs.Int("min-relays", 0, "check: fail (exit 3) when fewer than `N` relays serve the table (recorded themselves within 15s)")
	var maxSilence ageFlag
	fs.Var(&maxSilence, "max-relay-silence", "check: fail (exit 3) when no relay has recorded itself for longer than `D` (e.g. 1m)")
	asJSON := fs.Bool("json", false, "print one JSON object")
	if pos, err := parse(fs, args); err != nil {
		return err
	} else if len(pos) > 0 {
		return usagef("stats takes no arguments, got %q", pos)
	}
	t, err := c.open(ctx, o.resolved(), true, false)
	if err != nil {
		return err
	}
	defer t.close()
	st, err := t.ob.Stats(t.db.WithContext(ctx))
	if err != nil {
		return err
	}
	now := time.Now()
	if *asJSON {
		err = c.statsJSON(t.table, st)
	} else {
		err = c.statsText(t.table, st, now)
	}
	if err != nil {
		return err
	}
	var failed []string
	if *minRelays > 0 && len(st.Relays) < *minRelays {
		failed = append(failed, fmt.Sprintf("%d relays serve the table (at least %d wanted)", len(st.Relays), *minRelays))
	}
	if maxSilence.d > 0 && (st.RelaySeen.IsZero() || now.Sub(st.RelaySeen) > maxSilence.d) {
		failed = append(failed, fmt.Sprintf("no relay has recorded itself for %s (limit %s)", since(st.RelaySeen, now), maxSilence.d))
	}
	if maxAge.d > 0 && st.OldestPending > maxAge.d {
		failed = append(failed, fmt.Sprintf("the oldest pending event is %s old (limit %s)", age(st.OldestPending), maxAge.d))
	}
	if *maxFailed >= 0 && st.Failed > int64(*maxFailed) {
		failed = append(failed, fmt.Sprintf("%d events are failed (limit %d)", st.Failed, *maxFailed))
	}
	if *maxFailedHour >= 0 && st.FailedLastHour > int64(*maxFailedHour) {
		failed = append(failed, fmt.Sprintf("%d events failed in the last hour (limit %d)", st.FailedLastHour, *maxFailedHour))
	}
	if len(failed) > 0 {
		return checkFailed{errors.New(strings.Join(failed, "; "))}
	}
	return nil
}

// statsText prints st for a person: the counts, then a line per relay.
func (c *cli) statsText(table string, st outbox.Stats, now time.Time) error {
	_, err := fmt.Fprintf(c.stdout, "table             %s\npending           %d\nfailed            %d\nfailed last hour  %d\noldest pending    %s\nlast delivery     %s\nrelays            %d\n",
		table, st.Pending, st.Failed, st.FailedLastHour, age(st.OldestPending), since(st.LastDelivery, now), len(st.Relays))
	for _, r := range st.Relays {
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(c.stdout, "  %s  %s pid %d, %s, up %s, seen %s, last claim %s, last delivery %s%s\n",
			clean(r.Name, false), clean(r.Host, false), r.PID, r.Mode, age(now.Sub(r.Started)), since(r.Seen, now), since(r.LastClaim, now), since(r.LastDelivery, now), relayError(r.LastError))
	}
	return err
}

// statsJSON prints st as one JSON object.
func (c *cli) statsJSON(table string, st outbox.Stats) error {
	relays := make([]map[string]any, len(st.Relays))
	for i, r := range st.Relays {
		relays[i] = map[string]any{
			"name": r.Name, "host": r.Host, "pid": r.PID, "mode": r.Mode, "started": r.Started, "seen": r.Seen,
			"last_claim": jsonTime(r.LastClaim), "last_delivery": jsonTime(r.LastDelivery), "last_error": r.LastError,
		}
	}
	return json.NewEncoder(c.stdout).Encode(map[string]any{
		"table": table, "pending": st.Pending, "failed": st.Failed,
		"failed_last_hour": st.FailedLastHour, "oldest_pending_seconds": st.OldestPending.Seconds(),
		"last_delivery": jsonTime(st.LastDelivery), "relay_seen": jsonTime(st.RelaySeen), "relays": relays,
	})
}

// jsonTime is t for JSON, null for zero.
func jsonTime(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t
}

// since is how long ago t was, "never" for zero.
func since(t, now time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return age(max(now.Sub(t), time.Second)) + " ago"
}

func relayError(e string) string {
	if e == "" {
		return ""
	}
	return ", last error: " + oneLine(e, 200)
}

func age(d time.Duration) string {
	if d == 0 {
		return "-"
	}
	return d.Round(time.Second).String()
}

func (c *cli) list(ctx context.Context, args []string) error {
	fs := c.flags("list", "[filters] [--limit N] [--before SEQ | --oldest [--after SEQ]] [--json [--payload]]")
	o := c.common(fs)
	var ff filterFlags
	ff.add(fs)
	limit := fs.Int("limit", 50, "at most `N` events (up to 1000)")
	oldest := fs.Bool("oldest", false, "oldest first (newest first without it)")
	newest := fs.Bool("newest", false, "newest first: the default, kept for scripts")
	after := fs.Int64("after", 0, "events after `SEQ`, oldest first (implies --oldest): the last SEQ of the previous page")
	before := fs.Int64("before", 0, "events before `SEQ`, newest first: the last SEQ of the previous page")
	asJSON := fs.Bool("json", false, "print one JSON object per line")
	payload := fs.Bool("payload", false, "include payloads in --json output (they may hold personal data)")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef("list takes no arguments, got %q (use --id to list events by ID)", pos)
	}
	if *limit < 1 || *limit > 1000 {
		return usagef("--limit %d: use 1 to 1000", *limit)
	}
	newestFirst, err := listOrder(*oldest, *newest, *after, *before)
	if err != nil {
		return err
	}
	f, err := ff.filter(time.Now(), nil)
	if err != nil {
		return err
	}
	t, err := c.open(ctx, o.resolved(), true, false)
	if err != nil {
		return err
	}
	defer t.close()
	rows, err := t.ob.List(t.db.WithContext(ctx), outbox.ListParams{Filter: f, Limit: *limit, AfterSeq: *after, Newest: newestFirst, BeforeSeq: *before})
	if err != nil {
		return err
	}
	if err := c.printRows(rows, *asJSON, *payload); err != nil {
		return err
	}
	if len(rows) == 0 {
		fmt.Fprintln(c.stderr, "(no events match)")
	}
	if len(rows) == *limit {
		next := fmt.Sprintf("--before %d", rows[len(rows)-1].Seq)
		if !newestFirst {
			next = fmt.Sprintf("--after %d", rows[len(rows)-1].Seq)
		}
		fmt.Fprintf(c.stderr, "(more may follow: add %s)\n", next)
	}
	return nil
}

// listOrder reads list's order flags: newest first, as the dashboard
// lists, unless --oldest or --after, which pages the other way.
func listOrder(oldest, newest bool, after, before int64) (newestFirst bool, err error) {
	newestFirst = !oldest && after == 0
	switch {
	case oldest && newest:
		return false, usagef("--oldest and --newest: give one")
	case after > 0 && newest:
		return false, usagef("--after pages oldest first; newest first, page with --before")
	case before > 0 && !newestFirst:
		return false, usagef("--before pages newest first; oldest first, page with --after")
	}
	return newestFirst, nil
}

// printRows prints rows as a table, or as JSON lines (with their
// payloads when asked).
func (c *cli) printRows(rows []outbox.Row, asJSON, payload bool) error {
	if !asJSON {
		return writeTable(c.stdout, rows)
	}
	enc := json.NewEncoder(c.stdout)
	for _, r := range rows {
		if err := enc.Encode(toJSON(r, payload)); err != nil {
			return err
		}
	}
	return nil
}

func (c *cli) show(ctx context.Context, args []string) error {
	fs := c.flags("show", "ID [--no-payload] [--json]")
	c.exitStatuses(fs, `  0  ok
  1  an error (the database)
  2  a usage error
  4  no event has this ID
`)
	o := c.common(fs)
	noPayload := fs.Bool("no-payload", false, "do not print the payload (it may hold personal data)")
	asJSON := fs.Bool("json", false, "print one JSON object")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("show takes one event ID")
	}
	t, err := c.open(ctx, o.resolved(), true, false)
	if err != nil {
		return err
	}
	defer t.close()
	r, err := t.ob.Get(t.db.WithContext(ctx), pos[0])
	if err != nil {
		return err
	}
	if *asJSON {
		return json.NewEncoder(c.stdout).Encode(toJSON(r, !*noPayload))
	}
	return writeRow(c.stdout, r, !*noPayload)
}

// selection is what replay and purge act on.
type selection struct {
	fs     *filterFlags
	all    *bool
	dryRun *bool
	yes    *bool
}

func (c *cli) replay(ctx context.Context, args []string) error {
	fs := c.flags("replay", "[ID...] [filters] [--all] [--dry-run] [--yes]")
	c.exitStatuses(fs, `  0  ok (also when no failed event matches a filter)
  1  an error (the database, a declined confirmation)
  2  a usage error
  4  an event ID not in the table
  5  a named event that is not failed
  With several IDs, the others are replayed, and the status is the worst:
  1, then 4, then 5.
`)
	o := c.common(fs)
	s := selectionFlags(fs, "replay every failed event")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	f, err := s.fs.filter(time.Now(), pos)
	if err != nil {
		return err
	}
	if empty(f) && !*s.all {
		return usagef("replay needs event IDs, a filter (--type, --error, --since, ...) or --all")
	}
	if len(f.Statuses) > 0 && !slices.Contains(f.Statuses, outbox.StatusFailed) {
		return usagef("replay changes only failed events; --status %s leaves them out", strings.Join(strs(f.Statuses), ","))
	}
	f.Statuses = []outbox.Status{outbox.StatusFailed}
	t, err := c.open(ctx, o.resolved(), true, false)
	if err != nil {
		return err
	}
	defer t.close()
	named, err := c.namedEvents(ctx, t, &f, func(r outbox.Row) string {
		if r.Status != outbox.StatusFailed {
			return "replay changes only failed events"
		}
		return ""
	})
	if err != nil {
		return err
	}
	if named != nil && len(f.IDs) == 0 {
		return named // none left; without IDs, f would select more
	}
	ok, err := c.confirm(ctx, t, s, f, "replay", "failed events")
	if err != nil || !ok {
		return cmp.Or(err, named)
	}
	n, err := t.ob.Replay(t.db.WithContext(outbox.WithActor(ctx, c.actor())), f)
	fmt.Fprintf(c.stdout, "replayed %d events (pending again, due now)\n", n)
	return cmp.Or(err, named)
}

func (c *cli) purge(ctx context.Context, args []string) error {
	fs := c.flags("purge", "[ID...] [filters] [--older-than D] [--all] [--dry-run] [--yes]")
	c.exitStatuses(fs, `  0  ok (also when no event matches a filter)
  1  an error (the database, a declined confirmation)
  2  a usage error
  4  an event ID not in the table
  5  a named event this purge does not delete: pending, or sent or failed
     when --status (or --older-than, which means sent) leaves it out
  With several IDs, the others are deleted, and the status is the worst:
  1, then 4, then 5.
`)
	o := c.common(fs)
	var older ageFlag
	fs.Var(&older, "older-than", "sent events created more than `D` ago (e.g. 720h or 30d); with --status failed, failed ones")
	s := selectionFlags(fs, "purge every sent and failed event")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	now := time.Now()
	f, err := s.fs.filter(now, pos)
	if err != nil {
		return err
	}
	if slices.Contains(f.Statuses, outbox.StatusPending) {
		return usagef("purge never deletes pending events (replay them or let the relay deliver them)")
	}
	if older.d > 0 {
		until := now.Add(-older.d)
		if f.CreatedUntil.IsZero() || until.Before(f.CreatedUntil) {
			f.CreatedUntil = until
		}
		if len(f.Statuses) == 0 {
			f.Statuses = []outbox.Status{outbox.StatusSent}
		}
	}
	if empty(f) && !*s.all {
		return usagef("purge needs event IDs, --older-than, a filter (--status failed, --type, ...) or --all")
	}
	if len(f.Statuses) == 0 {
		f.Statuses = []outbox.Status{outbox.StatusSent, outbox.StatusFailed}
	}
	t, err := c.open(ctx, o.resolved(), true, false)
	if err != nil {
		return err
	}
	defer t.close()
	named, err := c.namedEvents(ctx, t, &f, func(r outbox.Row) string {
		switch status := r.Status; {
		case status == outbox.StatusPending:
			return "purge never deletes pending events"
		case !slices.Contains(f.Statuses, status):
			return "this purge deletes only " + strings.Join(strs(f.Statuses), " and ") + " events"
		}
		return ""
	})
	if err != nil {
		return err
	}
	if named != nil && len(f.IDs) == 0 {
		return named // none left; without IDs, f would select more
	}
	ok, err := c.confirm(ctx, t, s, f, "delete", strings.Join(strs(f.Statuses), " and ")+" events")
	if err != nil || !ok {
		return cmp.Or(err, named)
	}
	n, err := t.ob.Purge(t.db.WithContext(ctx), f)
	fmt.Fprintf(c.stdout, "deleted %d events\n", n)
	return cmp.Or(err, named)
}

// statusError is a named event in a status the command does not act on.
type statusError struct {
	id     string
	status outbox.Status
	why    string
}

func (e statusError) Error() string { return fmt.Sprintf("event %s is %s; %s", e.id, e.status, e.why) }

// namedProblems are the unknown and wrong-status events among those named
// by ID, printed already; they set the exit status.
type namedProblems struct{ error }

func (n namedProblems) Unwrap() error { return n.error }

// namedEvents looks up the events f names by ID and prints on stderr each
// the table does not hold and each in a state the command does not act
// on (why gives the reason, or "" for a row it acts on), returning them
// as a namedProblems, or nil. It leaves in f.IDs only the other IDs, once
// each, so that the command acts on what it checked. When it leaves none,
// f no longer narrows by ID: the caller must not act on it.
func (c *cli) namedEvents(ctx context.Context, t *target, f *outbox.Filter, why func(outbox.Row) string) (problems, err error) {
	if len(f.IDs) == 0 {
		return nil, nil
	}
	var ids []string
	seen := make(map[string]bool, len(f.IDs))
	for _, id := range f.IDs {
		if !seen[id] {
			seen[id] = true
			ids = append(ids, id)
		}
	}
	found := make(map[string]outbox.Row, len(ids))
	// One query per 1000 IDs rather than one per ID: the IDs may come from
	// a script by the thousand. IDs are unique, so a chunk is one page.
	for chunk := range slices.Chunk(ids, 1000) {
		rows, err := t.ob.List(t.db.WithContext(ctx), outbox.ListParams{Filter: outbox.Filter{IDs: chunk}, Limit: len(chunk)})
		if err != nil {
			return nil, err
		}
		for _, r := range rows {
			found[r.ID] = r
		}
	}
	var bad []error
	f.IDs = nil
	for _, id := range ids {
		r, ok := found[id]
		var p error
		if !ok {
			p = fmt.Errorf("%w: %s", outbox.ErrNotFound, id)
		} else if reason := why(r); reason != "" {
			p = statusError{id: id, status: r.Status, why: reason}
		} else {
			f.IDs = append(f.IDs, id)
			continue
		}
		c.printErr(p)
		bad = append(bad, p)
	}
	if len(bad) == 0 {
		return nil, nil
	}
	return namedProblems{errors.Join(bad...)}, nil
}

func selectionFlags(fs *flag.FlagSet, allUsage string) *selection {
	s := &selection{fs: &filterFlags{}}
	s.fs.add(fs)
	s.all = fs.Bool("all", false, "with no IDs or filter: "+allUsage)
	s.dryRun = fs.Bool("dry-run", false, "print what would change, and change nothing")
	s.yes = fs.Bool("yes", false, "do not ask for confirmation")
	return s
}

// strs is ss as plain strings, for joining into text.
func strs[S ~string](ss []S) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = string(s)
	}
	return out
}

// confirm counts what f selects and, on a dry run, lists it; otherwise it
// asks for confirmation on stdin unless --yes. It reports whether to go on.
func (c *cli) confirm(ctx context.Context, t *target, s *selection, f outbox.Filter, verb, what string) (bool, error) {
	n, err := t.ob.Count(t.db.WithContext(ctx), f)
	if err != nil {
		return false, err
	}
	if n == 0 {
		fmt.Fprintf(c.stdout, "no %s match\n", what)
		return false, nil
	}
	if *s.dryRun {
		if err := pages(ctx, t, f, func(rows []outbox.Row) error { return writeTable(c.stdout, rows) }); err != nil {
			return false, err
		}
		fmt.Fprintf(c.stdout, "dry run: would %s %d %s in table %s; nothing changed\n", verb, n, what, t.table)
		return false, nil
	}
	return c.ask(s, t, verb, n, what)
}

// pages lists the rows f matches, by seq, a page of 1000 at a time.
func pages(ctx context.Context, t *target, f outbox.Filter, each func([]outbox.Row) error) error {
	var after int64
	for {
		rows, err := t.ob.List(t.db.WithContext(ctx), outbox.ListParams{Filter: f, Limit: 1000, AfterSeq: after})
		if err != nil || len(rows) == 0 {
			return err
		}
		if err := each(rows); err != nil {
			return err
		}
		after = rows[len(rows)-1].Seq
	}
}

// ask asks for confirmation on stdin, unless --yes, and reports whether
// to go on.
func (c *cli) ask(s *selection, t *target, verb string, n int64, what string) (bool, error) {
	if *s.yes {
		return true, nil
	}
	fmt.Fprintf(c.stderr, "%s %d %s in table %s? [y/N] ", upper(verb), n, what, t.table)
	line, err := bufio.NewReader(c.stdin).ReadString('\n')
	if err != nil && line == "" {
		fmt.Fprintln(c.stderr)
		return false, errors.New("not confirmed (no answer on stdin; pass --yes to skip the question)")
	}
	switch strings.ToLower(strings.TrimSpace(line)) {
	case "y", "yes":
		return true, nil
	}
	return false, errors.New("not confirmed; nothing changed")
}

func upper(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}
