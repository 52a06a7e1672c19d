package main

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"os/user"
	"slices"
	"strings"
	"time"

	"github.com/gorm-outbox/outbox"
)

// retryNow makes pending events waiting for a retry (a failed attempt's
// backoff) due at once, with outbox.Outbox.RetryNow: after a receiver is
// fixed, its events need not wait out up to 10 minutes of backoff. replay
// only touches failed events.
func (c *cli) retryNow(ctx context.Context, args []string) error {
	fs := c.flags("retry-now", "[ID...] [filters] [--all] [--dry-run] [--yes]")
	c.exitStatuses(fs, `  0  ok (also when no event waiting for a retry matches a filter)
  1  an error (the database, a declined confirmation)
  2  a usage error
  4  an event ID not in the table
  5  a named event that waits for no retry: not pending, or pending and
     due already (or being delivered now)
  With several IDs, the others are retried, and the status is the worst:
  1, then 4, then 5.
`)
	o := c.common(fs)
	s := selectionFlags(fs, "retry every pending event waiting for a retry")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	f, err := s.fs.filter(time.Now(), pos)
	if err != nil {
		return err
	}
	if empty(f) && !*s.all {
		return usagef("retry-now needs event IDs, a filter (--type, --error, --since, ...) or --all")
	}
	if len(f.Statuses) > 0 && !slices.Contains(f.Statuses, outbox.StatusPending) {
		return usagef("retry-now changes only pending events waiting for a retry; --status %s leaves them out", strings.Join(strs(f.Statuses), ","))
	}
	f.Statuses = []outbox.Status{outbox.StatusPending}
	t, err := c.open(ctx, o.resolved(), true, false)
	if err != nil {
		return err
	}
	defer t.close()
	now := time.Now()
	named, err := c.namedEvents(ctx, t, &f, func(r outbox.Row) string {
		switch {
		case r.Status != outbox.StatusPending:
			return "retry-now changes only pending events waiting for a retry"
		case !waiting(r, now):
			return "it waits for no retry (due already, or being delivered now)"
		}
		return ""
	})
	if err != nil {
		return err
	}
	if named != nil && len(f.IDs) == 0 {
		return named // none left; without IDs, f would select more
	}
	ok, err := c.confirmRetry(ctx, t, s, f)
	if err != nil || !ok {
		return cmp.Or(err, named)
	}
	n, err := t.ob.RetryNow(t.db.WithContext(outbox.WithActor(ctx, c.actor())), f)
	fmt.Fprintf(c.stdout, "retried %d events now (due now, attempts kept)\n", n)
	return cmp.Or(err, named)
}

// waiting tells whether r is a pending event waiting for a retry, as
// outbox.Outbox.RetryNow would change it at now: due later and not held
// by a relay's lease (a relay delivering it).
func waiting(r outbox.Row, now time.Time) bool {
	return r.Status == outbox.StatusPending && r.AvailableAt.After(now) &&
		(r.LockedUntil == nil || !r.LockedUntil.After(now))
}

// confirmRetry counts the pending events f matches that wait for a retry
// and, on a dry run, lists them; otherwise it asks for confirmation unless
// --yes. No filter of the core's selects them (it has none on the next
// attempt's time): it reads the pending rows f matches, a page at a time
// through the pending rows' index, and looks at each one's next attempt,
// as RetryNow will. The count is of now: a row that becomes due meanwhile
// is then left alone by RetryNow, one that fails meanwhile is retried too.
func (c *cli) confirmRetry(ctx context.Context, t *target, s *selection, f outbox.Filter) (bool, error) {
	const what = "pending events waiting for a retry"
	now := time.Now()
	var n, pending int64
	err := pages(ctx, t, f, func(rows []outbox.Row) error {
		pending += int64(len(rows))
		var wait []outbox.Row
		for _, r := range rows {
			if waiting(r, now) {
				wait = append(wait, r)
			}
		}
		n += int64(len(wait))
		if *s.dryRun && len(wait) > 0 {
			return writeTable(c.stdout, wait)
		}
		return nil
	})
	if err != nil {
		return false, err
	}
	if n == 0 {
		fmt.Fprintf(c.stdout, "no %s match", what)
		if pending > 0 {
			fmt.Fprintf(c.stdout, " (%d pending, due already or being delivered)", pending)
		}
		fmt.Fprintln(c.stdout)
		return false, nil
	}
	if *s.dryRun {
		fmt.Fprintf(c.stdout, "dry run: would retry now %d %s in table %s (of %d pending matching); nothing changed\n", n, what, t.table, pending)
		return false, nil
	}
	return c.ask(s, t, "retry now", n, what)
}

// actor is who acts, for the history of the events replay and retry-now
// change: $OUTBOX_ACTOR, else the user and host the command runs as.
func (c *cli) actor() string {
	if a := strings.TrimSpace(c.env("OUTBOX_ACTOR")); a != "" {
		return a
	}
	name := "unknown"
	if u, err := user.Current(); err == nil && u.Username != "" {
		name = u.Username
	}
	host, _ := os.Hostname()
	return "outbox command: " + name + "@" + cmp.Or(host, "unknown")
}

// suggest returns the command of names nearest to name, when it is near
// enough to be what was meant ("status" → "stats"): at most two edits
// away (an insertion, a deletion, a substitution or two neighbours
// swapped), one for a name of up to four letters; or the one command name
// is the start of. "" when none is, or two are as near.
func suggest(name string, names []string) string {
	name = strings.ToLower(name)
	best, bestD, tie := "", 0, false
	for _, n := range names {
		if len(name) >= 3 && strings.HasPrefix(n, name) {
			return n
		}
		d := editDistance(name, n)
		switch {
		case best == "" || d < bestD:
			best, bestD, tie = n, d, false
		case d == bestD:
			tie = true
		}
	}
	limit := 2
	if len(name) <= 4 {
		limit = 1
	}
	if best == "" || tie || bestD > limit {
		return ""
	}
	return best
}

// editDistance is the optimal string alignment distance between a and b:
// the insertions, deletions, substitutions and swaps of neighbours that
// turn one into the other.
func editDistance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	d := make([][]int, len(ra)+1)
	for i := range d {
		d[i] = make([]int, len(rb)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(ra); i++ {
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && ra[i-1] == rb[j-2] && ra[i-2] == rb[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(ra)][len(rb)]
}
