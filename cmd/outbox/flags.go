package main

import (
	"errors"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/gorm-outbox/outbox"
)

// common are the flags every command that touches the database takes.
type common struct {
	dsn, table string
	env        func(string) string
}

// flags returns a command's flag set, with --dsn and --table unless
// synopsis is empty.
func (c *cli) flags(name, synopsis string) *flag.FlagSet {
	fs := flag.NewFlagSet("outbox "+name, flag.ContinueOnError)
	fs.SetOutput(c.stderr)
	fs.Usage = func() {
		fmt.Fprintf(c.stderr, "Usage: outbox %s %s\n\nFlags:\n", name, synopsis)
		fs.PrintDefaults()
	}
	return fs
}

// exitStatuses adds to a command's -h what its exit statuses mean (one
// indented line each), for the commands whose statuses say more than ok,
// error and usage error.
func (c *cli) exitStatuses(fs *flag.FlagSet, meanings string) {
	usage := fs.Usage
	fs.Usage = func() {
		usage()
		fmt.Fprint(c.stderr, "\nExit status:\n"+meanings)
	}
}

func (c *cli) common(fs *flag.FlagSet) *common {
	o := &common{env: c.env}
	// The environment is read after parsing, not made the flags' default:
	// -h prints defaults, and a DSN may hold a password.
	fs.StringVar(&o.dsn, "dsn", "", "the database (default $OUTBOX_DSN)")
	fs.StringVar(&o.table, "table", "", "the outbox table (default $OUTBOX_TABLE, else outbox_events)")
	return o
}

// resolved fills what the flags left empty from the environment.
func (o *common) resolved() *common {
	o.dsn = cmpOr(o.dsn, o.env("OUTBOX_DSN"))
	o.table = cmpOr(o.table, o.env("OUTBOX_TABLE"), outbox.DefaultTable)
	return o
}

func cmpOr(vals ...string) string {
	for _, v := range vals {
		if v != "" {
			return v
		}
	}
	return ""
}

// parse parses args, allowing flags after positional arguments (outbox
// show ID --no-payload), and returns the positional ones.
func parse(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, errHelp
			}
			return nil, usageError{err}
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

// list is a flag taking comma-separated values, and repeatable.
type list []string

func (l *list) String() string { return strings.Join(*l, ",") }

func (l *list) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			*l = append(*l, s)
		}
	}
	return nil
}

// filterFlags are the flags that build an outbox.Filter.
type filterFlags struct {
	ids, statuses, types  list
	aggType, aggID, errIn string
	since, until          string
}

func (ff *filterFlags) add(fs *flag.FlagSet) {
	fs.Var(&ff.ids, "id", "event `IDs` (comma-separated, or repeat the flag)")
	fs.Var(&ff.statuses, "status", "`statuses`: pending, sent, failed (comma-separated, or repeat the flag)")
	fs.Var(&ff.types, "type", "event `types` (comma-separated, or repeat the flag)")
	fs.StringVar(&ff.aggType, "aggregate-type", "", "the aggregate's type")
	fs.StringVar(&ff.aggID, "aggregate-id", "", "the aggregate's ID")
	fs.StringVar(&ff.since, "since", "", "created at or after `WHEN`: a time (2026-12-01T03:00:00Z, 2026-12-01) or an age (2h, 7d)")
	fs.StringVar(&ff.until, "until", "", "created before `WHEN`: a time or an age, as --since")
	fs.StringVar(&ff.errIn, "error", "", "the last error contains `TEXT` (ignoring case)")
}

// filter builds the filter the flags (and positional IDs) describe.
func (ff *filterFlags) filter(now time.Time, ids []string) (outbox.Filter, error) {
	f := outbox.Filter{
		IDs:           append(append([]string(nil), ff.ids...), ids...),
		Types:         ff.types,
		AggregateType: ff.aggType,
		AggregateID:   ff.aggID,
		ErrorContains: ff.errIn,
	}
	for _, s := range ff.statuses {
		switch st := outbox.Status(s); st {
		case outbox.StatusPending, outbox.StatusSent, outbox.StatusFailed:
			f.Statuses = append(f.Statuses, st)
		default:
			return f, usagef("unknown status %q (use pending, sent or failed)", s)
		}
	}
	var err error
	if f.CreatedSince, err = parseWhen("since", ff.since, now); err != nil {
		return f, err
	}
	if f.CreatedUntil, err = parseWhen("until", ff.until, now); err != nil {
		return f, err
	}
	return f, nil
}

// empty reports whether f selects every row.
func empty(f outbox.Filter) bool {
	return len(f.IDs) == 0 && len(f.Statuses) == 0 && len(f.Types) == 0 && f.AggregateType == "" &&
		f.AggregateID == "" && f.CreatedSince.IsZero() && f.CreatedUntil.IsZero() && f.ErrorContains == ""
}

var whenLayouts = []string{time.RFC3339Nano, "2006-01-02T15:04:05", "2006-01-02 15:04:05", "2006-01-02"}

// parseWhen reads a time (UTC unless it says otherwise) or an age before
// now.
func parseWhen(flagName, s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if d, err := parseAge(s); err == nil {
		return now.Add(-d), nil
	}
	for _, l := range whenLayouts {
		if t, err := time.Parse(l, s); err == nil {
			return t, nil
		}
	}
	return time.Time{}, usagef("--%s %q: use a time such as 2026-12-01T03:00:00Z or 2026-12-01 (UTC), or an age such as 90m, 2h or 7d", flagName, s)
}

// parseAge reads a Go duration, or a number of days ("7d").
func parseAge(s string) (time.Duration, error) {
	if n, ok := strings.CutSuffix(s, "d"); ok {
		days, err := strconv.ParseFloat(n, 64)
		if err != nil || days < 0 {
			return 0, fmt.Errorf("bad age %q", s)
		}
		return time.Duration(days * 24 * float64(time.Hour)), nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("bad age %q", s)
	}
	return d, nil
}

// ageFlag is a duration flag that also takes days.
type ageFlag struct{ d time.Duration }

func (a *ageFlag) String() string {
	if a == nil || a.d == 0 {
		return ""
	}
	return a.d.String()
}

func (a *ageFlag) Set(s string) error {
	d, err := parseAge(s)
	if err != nil {
		return errors.New("use a duration such as 90s, 15m, 2h or 7d")
	}
	a.d = d
	return nil
}
