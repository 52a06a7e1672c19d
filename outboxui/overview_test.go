package outboxui_test

import (
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/outboxui"
)

// TestOverviewCharts: the overview's counts per type and its charts'
// values are the table's, on every database.
func TestOverviewCharts(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t, b, outboxui.Options{})
			e.publish(outbox.Event{ID: "more-1", Type: "order.paid"})
			e.drain()
			seed(e) // 2 sent, 2 failed, 2 pending

			for _, window := range []string{"", "?window=24h", "?window=7d"} {
				code, body := e.get(window)
				require.Equal(t, http.StatusOK, code, body)
				ov, err := e.ob.Overview(e.db.WithContext(t.Context()), outbox.OverviewParams{})
				require.NoError(t, err)
				assert.Contains(t, body, `id="count-pending">2<`)
				assert.Contains(t, body, `id="count-failed">2<`)
				assert.Contains(t, body, `id="count-sent">3<`, "delivered in the window")
				assert.Contains(t, body, `id="published">7<`)
				for _, typ := range []struct {
					name                      string
					pending, failed, pub, del int
				}{
					{"order.created", 2, 0, 3, 1},
					{"order.paid", 0, 0, 2, 2},
					{"fails.card", 0, 1, 1, 0},
					{"fails.mail", 0, 1, 1, 0},
				} {
					row := typeRow(t, body, typ.name)
					assert.Equal(t, []int{typ.pending, typ.failed, typ.pub, typ.del}, row, "%s %s", window, typ.name)
					n, err := e.ob.Count(e.db.WithContext(t.Context()), outbox.Filter{Types: []string{typ.name}, Statuses: []outbox.Status{outbox.StatusPending}})
					require.NoError(t, err)
					assert.EqualValues(t, n, row[0], "pending %s as the table counts it", typ.name)
				}
				// The flow chart's values sum to the window's counts; the
				// backlog chart ends at the pending count.
				flow := chartValues(t, body, "chart-flow")
				var pub, del, failed int
				for _, r := range flow {
					pub, del, failed = pub+r[0], del+r[1], failed+r[2]
				}
				assert.Equal(t, []int{7, 3, 2}, []int{pub, del, failed}, window)
				backlog := chartValues(t, body, "chart-backlog")
				assert.Equal(t, []int{2}, backlog[len(backlog)-1], window)
				assert.Equal(t, int64(3), ov.Delivered)
			}
			_, body := e.get("?window=7d")
			assert.Contains(t, body, `href="?window=7d" aria-current="true"`)
		})
	}
}

// typeRow reads the numbers of one row of the table by type.
func typeRow(t *testing.T, body, typ string) []int {
	t.Helper()
	i := strings.Index(body, `<tr data-type="`+typ+`">`)
	require.GreaterOrEqual(t, i, 0, "no row for %s", typ)
	row := body[i : i+strings.Index(body[i:], "</tr>")]
	return nums(t, row)
}

var numRE = regexp.MustCompile(`<td class="num">(?:<a [^>]*>)?([0-9,]+)<`)

func nums(t *testing.T, s string) []int {
	t.Helper()
	var out []int
	for _, m := range numRE.FindAllStringSubmatch(s, -1) {
		n, err := strconv.Atoi(strings.ReplaceAll(m[1], ",", ""))
		require.NoError(t, err)
		out = append(out, n)
	}
	return out
}

// chartValues reads a chart's table of values, one row an interval.
func chartValues(t *testing.T, body, id string) [][]int {
	t.Helper()
	i := strings.Index(body, `id="`+id+`"`)
	require.GreaterOrEqual(t, i, 0, "no chart %s", id)
	fig := body[i : i+strings.Index(body[i:], "</figure>")]
	var out [][]int
	for _, row := range strings.Split(fig, "<tr>")[2:] {
		out = append(out, nums(t, row))
	}
	require.NotEmpty(t, out)
	return out
}

// TestOverviewDelay: the delay chart and the summary read the rollup's
// histogram: an event delivered two minutes after it was written shows a
// p99 within its bin (1 to 5 min).
func TestOverviewDelay(t *testing.T) {
	b := backends(t)[0]
	e := setup(t, b, outboxui.Options{})
	e.publish(outbox.Event{ID: "late", Type: "t"})
	e.backdate("late", time.Now().Add(-2*time.Minute))
	e.drain()
	ov, err := e.ob.Overview(e.db.WithContext(t.Context()), outbox.OverviewParams{})
	require.NoError(t, err)
	require.Equal(t, int64(1), ov.Delay.N)
	assert.GreaterOrEqual(t, ov.Delay.P99, time.Minute)
	assert.LessOrEqual(t, ov.Delay.P99, 5*time.Minute)
	_, body := e.get("")
	// One delay in the bin of 1 to 5 min: the percentiles are read
	// within it, so they are approximate and say so: the p99 is past the
	// one delivery's 2 minutes.
	assert.Contains(t, body, `id="delay">p50 ≈3m, p90 ≈4m40s, p99 ≈5m (1 delivered) <span class="note" id="delay-note">(≈: approximate`)
	assert.Contains(t, body, "Delivery delay, created to sent (≈, from a histogram)", "and so does the chart")
}
