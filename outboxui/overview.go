package outboxui

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gorm-outbox/outbox"
)

// windows are the overview's chart windows, in the order the page offers
// them.
var windows = []struct {
	Key   string
	Label string
	D     time.Duration
}{
	{"1h", "last hour", time.Hour},
	{"24h", "last day", 24 * time.Hour},
	{"7d", "last week", 7 * 24 * time.Hour},
}

// overviewPage is the overview's template data.
type overviewPage struct {
	base
	Window  string // the key of the window shown
	Label   string
	Windows []windowLink
	O       outbox.Overview
	Failed  []outbox.Row
	Charts  []chart
	Logical bool
	// Delay is the window's delivery delay percentiles, as text.
	Delay string
	// Health is what the warning at the top and the relays panel say.
	Health health
}

type windowLink struct {
	Key, Label string
	Current    bool
}

func (h *handler) overview(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	key := r.URL.Query().Get("window")
	win := windows[0]
	for _, c := range windows {
		if c.Key == key {
			win = c
		}
	}
	ov, err := h.ob.Overview(h.db.WithContext(ctx), outbox.OverviewParams{Window: win.D})
	if err != nil {
		h.dbError(w, r, "overview", err)
		return
	}
	failed, err := h.ob.List(h.db.WithContext(ctx), outbox.ListParams{
		Filter: outbox.Filter{Statuses: []outbox.Status{outbox.StatusFailed}}, Limit: 10, Newest: true,
	})
	if err != nil {
		h.dbError(w, r, "list failed events", err)
		return
	}
	p := overviewPage{base: h.live(h.base(w, r, "overview")), Window: win.Key, Label: win.Label, O: ov, Failed: failed,
		Health: h.healthOf(ov.Stats)}
	for _, c := range windows {
		p.Windows = append(p.Windows, windowLink{c.Key, c.Label, c.Key == win.Key})
	}
	p.Charts = charts(ov)
	if ov.Delay.N > 0 {
		// Approximate: Overview reads them from a histogram, interpolated
		// within a bin, so p99 may pass the slowest delivery (52.5 s when
		// it took 33 s); the page says so rather than pretend.
		p.Delay = fmt.Sprintf("p50 ≈%s, p90 ≈%s, p99 ≈%s (%s delivered)", delayText(ov.Delay.P50), delayText(ov.Delay.P90), delayText(ov.Delay.P99), thousands(ov.Delay.N))
	}
	if h.ob.Mode() == outbox.Logical {
		p.Logical = true
		lag := lagOf(h)
		lag.add(ov.Now, ov.SlotLagBytes)
		p.Charts = append(p.Charts, lag.chart())
	}
	h.render(w, r, http.StatusOK, "overview.html", p)
}

// chart is one chart of the overview: an SVG of lines over the window's
// intervals, and the same numbers as a table (for screen readers, and to
// read exact values).
type chart struct {
	ID, Title, Unit string
	Lines           []line
	Max             string // the top of the y axis, as text
	From, To        string // the x axis' ends
	Rows            []chartRow
	Heads           []string
}

type line struct {
	Name, Class string
	Points      string // SVG polyline points in the 0..chartW × 0..chartH box
}

type chartRow struct {
	Start string
	Cells []string
}

const chartW, chartH = 600.0, 160.0

// charts draws the overview's charts.
func charts(ov outbox.Overview) []chart {
	n := len(ov.Intervals)
	series := func(f func(outbox.Interval) float64) []float64 {
		v := make([]float64, n)
		for i, iv := range ov.Intervals {
			v[i] = f(iv)
		}
		return v
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	flow := newChart("chart-flow", "Events per "+stepName(ov.Step), "events", ov,
		[]string{"published", "delivered", "failed"},
		series(func(iv outbox.Interval) float64 { return float64(iv.Published) }),
		series(func(iv outbox.Interval) float64 { return float64(iv.Delivered) }),
		series(func(iv outbox.Interval) float64 { return float64(iv.Failed) }))
	backlog := newChart("chart-backlog", "Backlog (pending at each interval's end)", "events", ov,
		[]string{"pending"}, series(func(iv outbox.Interval) float64 { return float64(iv.Backlog) }))
	delay := newChart("chart-delay", "Delivery delay, created to sent (≈, from a histogram)", "ms", ov,
		[]string{"p50", "p99"},
		series(func(iv outbox.Interval) float64 { return ms(iv.Delay.P50) }),
		series(func(iv outbox.Interval) float64 { return ms(iv.Delay.P99) }))
	return []chart{flow, backlog, delay}
}

func stepName(d time.Duration) string {
	switch {
	case d == time.Minute:
		return "minute"
	case d%time.Hour == 0:
		return strings.TrimSuffix(strings.TrimSuffix(d.String(), "0s"), "0m") + " interval"
	}
	return strings.TrimSuffix(d.String(), "0s") + " interval"
}

func newChart(id, title, unit string, ov outbox.Overview, names []string, values ...[]float64) chart {
	c := chart{ID: id, Title: title, Unit: unit, Heads: names}
	top := 0.0
	for _, v := range values {
		for _, x := range v {
			top = max(top, x)
		}
	}
	if top == 0 {
		top = 1
	}
	c.Max = number(top, unit)
	for k, v := range values {
		var b strings.Builder
		for i, x := range v {
			px := 0.0
			if len(v) > 1 {
				px = chartW * float64(i) / float64(len(v)-1)
			}
			fmt.Fprintf(&b, "%.1f,%.1f ", px, chartH-chartH*x/top)
		}
		c.Lines = append(c.Lines, line{Name: names[k], Class: names[k], Points: strings.TrimSpace(b.String())})
	}
	if n := len(ov.Intervals); n > 0 {
		c.From, c.To = ov.Intervals[0].Start.Format("Jan 2 15:04"), ov.Now.UTC().Format("Jan 2 15:04")
	}
	for i, iv := range ov.Intervals {
		row := chartRow{Start: iv.Start.Format("2006-01-02 15:04")}
		for _, v := range values {
			row.Cells = append(row.Cells, number(v[i], unit))
		}
		c.Rows = append(c.Rows, row)
	}
	if unit == "ms" {
		c.Unit = "" // the values are durations that say their unit
	}
	return c
}

// number formats a chart value: counts whole, delays as a duration to
// three significant digits.
func number(x float64, unit string) string {
	if unit == "ms" {
		return delayText(time.Duration(x * float64(time.Millisecond)))
	}
	return strconv.FormatFloat(x, 'f', 0, 64)
}

// delayText is a delay to about three significant digits: 0.4ms, 12.5ms,
// 2.31s, 16m20s.
func delayText(d time.Duration) string {
	switch {
	case d == 0:
		return "0"
	case d < time.Second:
		return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'g', 3, 64) + "ms"
	case d < time.Minute:
		return strconv.FormatFloat(d.Seconds(), 'g', 3, 64) + "s"
	}
	s := d.Round(10 * time.Second).String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	return s
}

// lagSamples keeps the Logical mode slot's lag as the overview reads it,
// for its lag-over-time chart: the database keeps no history of it, so the
// chart covers the time since this process served its first overview.
type lagSamples struct {
	mu    sync.Mutex
	at    []time.Time
	bytes []int64
}

// lags holds each handler's samples.
var lags sync.Map // *handler → *lagSamples

func lagOf(h *handler) *lagSamples {
	l, _ := lags.LoadOrStore(h, &lagSamples{})
	return l.(*lagSamples)
}

const lagKeep = 720 // an hour at the default 5 s refresh

func (l *lagSamples) add(t time.Time, lag int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if n := len(l.at); n > 0 && t.Sub(l.at[n-1]) < time.Second {
		return // several tabs refreshing: one sample a second is enough
	}
	l.at = append(l.at, t)
	l.bytes = append(l.bytes, lag)
	if len(l.at) > lagKeep {
		l.at, l.bytes = l.at[len(l.at)-lagKeep:], l.bytes[len(l.bytes)-lagKeep:]
	}
}

func (l *lagSamples) chart() chart {
	l.mu.Lock()
	defer l.mu.Unlock()
	ov := outbox.Overview{}
	v := make([]float64, len(l.at))
	for i, t := range l.at {
		ov.Intervals = append(ov.Intervals, outbox.Interval{Start: t})
		v[i] = float64(l.bytes[i])
		ov.Now = t
	}
	c := newChart("chart-lag", "Slot lag since this dashboard started", "bytes", ov, []string{"lag"}, v)
	return c
}
