// Command outbox operates the outbox table of github.com/gorm-outbox/outbox
// from a shell: it shows what is pending, failed or stuck, puts failed
// events back, deletes old or poison ones, and creates or upgrades the
// table.
//
//	go install github.com/gorm-outbox/outbox/cmd/outbox@latest
//
//	outbox stats   [--max-pending-age D] [--max-failed N] [--max-failed-last-hour N] [--min-relays N] [--max-relay-silence D] [--json]
//	outbox list    [filters] [--limit N] [--before SEQ | --oldest [--after SEQ]] [--json [--payload]]
//	outbox show    ID [--no-payload] [--json]
//	outbox replay  [ID...] [filters] [--all] [--dry-run] [--yes]
//	outbox retry-now [ID...] [filters] [--all] [--dry-run] [--yes]
//	outbox purge   [ID...] [filters] [--older-than D] [--all] [--dry-run] [--yes]
//	outbox migrate [--print-sql [--dialect NAME]]
//	outbox version
//	outbox ui      [--listen 127.0.0.1:8080] [--allow-actions] [--show-payloads] [--max-pending-age D]
//
// Every command takes --dsn (or the OUTBOX_DSN environment variable) and
// --table (or OUTBOX_TABLE; defaults to outbox_events). The database is
// told from the DSN's form: postgres:// or host=... key/value pairs for
// PostgreSQL; user:pass@tcp(host:3306)/db or mysql://user:pass@host/db for
// MySQL and MariaDB; file:path, sqlite://path or a path ending in .db,
// .sqlite or .sqlite3 for SQLite.
//
// list prints the newest events first (--oldest for the oldest). replay
// puts failed events back to pending; retry-now makes pending events that
// wait for a retry (a failed attempt's backoff) due at once, their
// attempts kept. Both record who acted in each event's history:
// $OUTBOX_ACTOR, else the user and host the command runs as.
//
// The filters, shared by list, replay, retry-now and purge: --id, --status, --type
// (each a comma-separated list, or repeated), --aggregate-type,
// --aggregate-id, --since and --until (a time such as 2026-12-01T03:00:00Z
// or 2026-12-01, or an age such as 2h or 7d), --error (text in the last
// error, ignoring case).
//
// Exit status: 0 on success, 1 on an error (the database, a declined
// confirmation), 2 on a usage error (a bad flag, an unknown status, an
// unknown command, with the nearest as "did you mean"), 3 when a check of
// stats fails, 4 when an event ID is not in the table, 5 when replay,
// retry-now or purge is given the ID of an event in a state it does not
// act on (replay: not failed; retry-now: not pending, or due already;
// purge: pending, or left out by --status or --older-than). Given several
// IDs, replay, retry-now and purge report each unknown or wrong-status
// one, act on the rest, and exit with the worst status: 1, then 4, then 5.
//
// Everything goes through the library's exported functions ([outbox.Outbox.List],
// [outbox.Outbox.Replay], [outbox.Outbox.RetryNow], [outbox.Outbox.Purge],
// ...), the same the dashboard uses.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"syscall"
)

// Exit statuses.
const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
	exitCheck = 3
	// exitNotFound is an event ID the table does not hold: a typo, or an
	// event already purged, which a script must tell from a database error.
	exitNotFound = 4
	// exitWrongStatus is a named event that replay or purge leaves alone
	// because of its status: nothing to do, which is not success either.
	exitWrongStatus = 5
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr, os.Getenv)
	stop()
	os.Exit(code)
}

// cli is one invocation's input and output.
type cli struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	env            func(string) string
}

// run runs the command line args (without the program name) and returns
// the exit status.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer, env func(string) string) int {
	c := &cli{stdin: stdin, stdout: stdout, stderr: stderr, env: env}
	if len(args) == 0 {
		c.usage(stderr)
		return exitUsage
	}
	cmds := map[string]func(context.Context, []string) error{
		"stats":     c.stats,
		"list":      c.list,
		"show":      c.show,
		"replay":    c.replay,
		"retry-now": c.retryNow,
		"purge":     c.purge,
		"migrate":   c.migrate,
		"version":   c.version,
		"ui":        c.ui,
	}
	name, rest := args[0], args[1:]
	switch name {
	case "help", "-h", "-help", "--help":
		c.usage(stdout)
		return exitOK
	}
	cmd, ok := cmds[name]
	if !ok {
		fmt.Fprintf(stderr, "outbox: unknown command %q", name)
		if near := suggest(name, slices.Sorted(maps.Keys(cmds))); near != "" {
			fmt.Fprintf(stderr, "; did you mean %s?", near)
		}
		fmt.Fprint(stderr, "\n\n")
		c.usage(stderr)
		return exitUsage
	}
	return c.exit(cmd(ctx, rest))
}

// exit reports err and returns the exit status it calls for.
func (c *cli) exit(err error) int {
	var (
		check checkFailed
		usage usageError
		named namedProblems
	)
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, errHelp):
		return exitOK
	case errors.As(err, &check):
		fmt.Fprintln(c.stderr, "CHECK FAILED:", err)
		return exitCheck
	case errors.As(err, &named):
		// Printed already, each as it was found.
		if isNotFound(err) {
			return exitNotFound
		}
		return exitWrongStatus
	}
	c.printErr(err)
	switch {
	case errors.As(err, &usage) || isInvalidFilter(err):
		return exitUsage
	case isNotFound(err):
		return exitNotFound
	}
	return exitError
}

// printErr prints err on stderr, as the command's own message.
func (c *cli) printErr(err error) {
	msg := err.Error()
	if !strings.HasPrefix(msg, "outbox: ") {
		msg = "outbox: " + msg
	}
	fmt.Fprintln(c.stderr, msg)
}

// usageError is a mistake in the command line.
type usageError struct{ error }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// checkFailed is a stats check that did not pass.
type checkFailed struct{ error }

var errHelp = errors.New("help shown")

func (c *cli) usage(w io.Writer) {
	fmt.Fprint(w, `outbox operates the outbox table of github.com/gorm-outbox/outbox.

Usage:
  outbox stats   [--max-pending-age D] [--max-failed N] [--max-failed-last-hour N] [--min-relays N] [--max-relay-silence D] [--json]
  outbox list    [filters] [--limit N] [--before SEQ | --oldest [--after SEQ]] [--json [--payload]]
  outbox show    ID [--no-payload] [--json]
  outbox replay  [ID...] [filters] [--all] [--dry-run] [--yes]
  outbox retry-now [ID...] [filters] [--all] [--dry-run] [--yes]
  outbox purge   [ID...] [filters] [--older-than D] [--all] [--dry-run] [--yes]
  outbox migrate [--print-sql [--dialect postgres|mysql|sqlite]]
  outbox version
  outbox ui      [--listen 127.0.0.1:8080] [--allow-actions] [--show-payloads] [--max-pending-age D]

Every command takes --dsn (or OUTBOX_DSN) and --table (or OUTBOX_TABLE,
default outbox_events). "outbox COMMAND -h" lists a command's flags.

list shows the newest events first (--oldest: the oldest). replay puts
failed events back to pending; retry-now makes pending events waiting for
a retry (a failed attempt's backoff) due now, their attempts kept.

Filters (list, replay, retry-now, purge): --id, --status, --type
(comma-separated or repeated), --aggregate-type, --aggregate-id, --since,
--until (a time such as 2026-12-01T03:00:00Z or an age such as 2h or 7d),
--error TEXT.

Exit status: 0 ok, 1 error, 2 usage error, 3 a stats check failed,
4 an event ID not in the table (show, replay, retry-now, purge),
5 a named event in a status the command does not act on (replay,
retry-now, purge). With several IDs, replay, retry-now and purge act on
the others and exit with the worst status: 1, then 4, then 5.
`)
}

func (c *cli) version(_ context.Context, args []string) error {
	fs := c.flags("version", "")
	if _, err := parse(fs, args); err != nil {
		return err
	}
	v, core := "(devel)", "(devel)"
	if bi, ok := debug.ReadBuildInfo(); ok {
		if bi.Main.Version != "" {
			v = bi.Main.Version
		}
		for _, d := range bi.Deps {
			if d.Path == "github.com/gorm-outbox/outbox" {
				core = d.Version
				if d.Replace != nil {
					core = d.Replace.Version
				}
			}
		}
		if core == "" {
			core = "(devel)"
		}
	}
	fmt.Fprintf(c.stdout, "outbox %s (core %s, %s)\n", v, core, runtime.Version())
	return nil
}
