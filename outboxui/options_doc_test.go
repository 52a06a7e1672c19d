package outboxui

import (
	"os"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestOptionsDocumented: the README's table of Options gives the code's
// defaults, so that they cannot drift.
func TestOptionsDocumented(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("(?m)^\\| `(\\w+)` \\| ([^|]+) \\|")
	got := map[string]string{}
	for _, m := range row.FindAllStringSubmatch(string(readme), -1) {
		got[m[1]] = strings.TrimSpace(m[2])
	}
	dur := func(d time.Duration) string {
		if d%time.Minute == 0 {
			return strings.TrimSuffix(strings.TrimSuffix(d.String(), "0s"), "m") + " min"
		}
		return strings.TrimSuffix(d.String(), "s") + " s"
	}
	for name, want := range map[string]string{
		"Refresh":       dur(defaultRefresh),
		"MaxPendingAge": dur(defaultMaxPendingAge),
		"PayloadsHint":  "`\"" + defaultPayloadsHint + "\"`",
		"AllowActions":  "false",
		"ShowPayloads":  "false",
	} {
		if got[name] != want {
			t.Errorf("README.md's Options table gives %s the default %q; the code's is %q", name, got[name], want)
		}
	}
}
