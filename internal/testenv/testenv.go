// Package testenv holds the rules the repository's tests share for what
// runs where (README, "Testing"; docs/testing.md):
//
//   - the quick tests (go test work) need nothing installed: a test that
//     needs a server skips, saying what to set;
//   - the full tests (OUTBOX_TEST_FULL=1, what CI runs) add the long suites,
//     and a missing prerequisite fails them instead of skipping;
//   - under CI (CI set) a missing prerequisite fails too.
package testenv

import (
	"flag"
	"os"
	"testing"
)

// FullEnv names the variable that runs the full suite.
const FullEnv = "OUTBOX_TEST_FULL"

// Full reports whether the full suite runs (OUTBOX_TEST_FULL=1).
func Full() bool { return os.Getenv(FullEnv) == "1" }

// Strict reports whether a missing prerequisite (a server, PostgreSQL's
// server binaries, a browser) fails a test rather than skipping it: in the
// full suite and under CI, where a skip would turn a broken set-up green.
func Strict() bool { return Full() || os.Getenv("CI") != "" }

// Selected reports whether go test was given -run: the tests it runs were
// chosen by name, so a long test named on the command line runs.
func Selected() bool {
	f := flag.Lookup("test.run")
	return f != nil && f.Value.String() != ""
}

// Long skips t unless the full suite runs or -run chose the tests: what
// says what makes the test long, for the skip message.
func Long(t testing.TB, what string) {
	t.Helper()
	if Full() || Selected() {
		return
	}
	t.Skipf("a long test (%s): it runs with %s=1 (the full suite) or when -run names it", what, FullEnv)
}
