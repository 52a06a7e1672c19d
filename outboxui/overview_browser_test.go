package outboxui_test

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/outboxui"
)

// TestBrowserOverview loads the overview in Chromium over a table with
// pending, failed and sent events: the cards and the table by type read
// the table's counts, each chart draws one line per series with a point
// per interval, its values add up to the counts, a new event arrives on the
// page in place, and the page fits a phone in both themes. With
// OUTBOXUI_SCREENSHOTS=1 it rewrites the README's overview screenshots.
func TestBrowserOverview(t *testing.T) {
	e := setup(t, backends(t)[0], outboxui.Options{Refresh: 300 * time.Millisecond, Title: "Outbox · orders-service"})
	seedRealistic(e)
	// History: a few earlier bursts, delivered.
	for i := range 30 {
		e.publish(outbox.Event{ID: fmt.Sprintf("hist-%02d", i), Type: "order.created"})
		e.backdate(fmt.Sprintf("hist-%02d", i), time.Now().Add(-time.Duration(5+i)*time.Minute))
	}
	e.drain()
	ov, err := e.ob.Overview(e.db.WithContext(t.Context()), outbox.OverviewParams{})
	require.NoError(t, err)

	b := newTab(t, 1280, 1000)
	b.open(e.base, "#chart-flow svg")
	b.a11y("the overview")
	assert.Equal(t, fmt.Sprint(ov.Pending), b.text("#count-pending"))
	assert.Equal(t, fmt.Sprint(ov.Failed), b.text("#count-failed"))
	assert.Equal(t, fmt.Sprint(ov.Delivered), b.text("#count-sent"))
	var lines map[string][]int
	require.NoError(t, json.Unmarshal([]byte(b.eval(`JSON.stringify(Object.fromEntries(Array.from(document.querySelectorAll("figure.chart")).map(f =>
		[f.id, Array.from(f.querySelectorAll("polyline")).map(p => p.points.numberOfItems)]))) `).(string)), &lines))
	n := len(ov.Intervals)
	assert.Equal(t, map[string][]int{"chart-flow": {n, n, n}, "chart-backlog": {n}, "chart-delay": {n, n}}, lines,
		"every series a line, a point per interval")
	// The values behind the flow chart add up to the window's counts.
	sums := b.eval(`JSON.stringify([0, 1, 2].map(i => Array.from(document.querySelectorAll("#chart-flow tbody tr")).reduce((s, tr) => s + Number(tr.querySelectorAll("td")[i].textContent), 0)))`)
	assert.Equal(t, fmt.Sprintf("[%d,%d,%d]", ov.Published, ov.Delivered, ov.FailedInWindow), sums)
	b.shot("overview.png")

	// A new pending event arrives in place.
	e.publish(outbox.Event{ID: "live-1", Type: "order.created"})
	b.poll(fmt.Sprintf(`document.querySelector("#count-pending").textContent.trim() === "%d"`, ov.Pending+1), "the pending count refreshes in place")

	b.scheme("dark")
	b.open(e.base+"?window=7d", "#chart-flow svg")
	assert.Equal(t, "true", b.eval(`String(document.querySelector('a[href="?window=7d"]').getAttribute("aria-current") === "true")`))
	stroke := b.eval(`getComputedStyle(document.querySelector("#chart-flow polyline.delivered")).stroke`)
	assert.NotEqual(t, "none", stroke, "the lines take the palette's colours")
	b.shot("overview-dark.png")
	b.scheme("light")
	b.phone()
	b.open(e.base, "#chart-flow svg")
	b.fitsWidth("the overview at 390 px", 390)
	b.shot("overview-phone.png")
}
