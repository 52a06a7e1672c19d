package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
)

// series is one measured quantity over the rounds.
type series []float64

func (s series) median() float64 {
	if len(s) == 0 {
		return 0
	}
	c := slices.Clone(s)
	slices.Sort(c)
	if len(c)%2 == 1 {
		return c[len(c)/2]
	}
	return (c[len(c)/2-1] + c[len(c)/2]) / 2
}

func (s series) min() float64 { return slices.Min(s) }
func (s series) max() float64 { return slices.Max(s) }

// row is one line of the result table.
type row struct {
	scenario  string
	contender string
	metric    string
	vals      series
	format    func(float64) string
	note      string // extra, e.g. absolute rates behind a ratio
	target    string // empty for rows that only give context
	verdict   string // PASS, MISS, or empty
}

type table struct{ rows []*row }

func (t *table) add(r *row) *row {
	t.rows = append(t.rows, r)
	return r
}

// judge sets r's target and verdict.
func (r *row) judge(target string, pass bool) {
	if r.target != "" {
		r.target += "; "
	}
	r.target += target
	v := "MISS"
	if pass {
		v = "PASS"
	}
	switch {
	case r.verdict == "":
		r.verdict = v
	case r.verdict != v:
		r.verdict = "MISS"
	}
}

func (t *table) print(w io.Writer) {
	fmt.Fprintln(w, "| scenario | contender | metric | median | spread (min–max) | notes | target | PASS/MISS |")
	fmt.Fprintln(w, "| --- | --- | --- | ---: | ---: | --- | --- | --- |")
	for _, r := range t.rows {
		med, spread := "n/a", ""
		if len(r.vals) > 0 {
			med = r.format(r.vals.median())
			spread = r.format(r.vals.min()) + " – " + r.format(r.vals.max())
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %s |\n",
			cell(r.scenario), cell(r.contender), cell(r.metric), med, spread, cell(r.note), cell(r.target), r.verdict)
	}
}

func cell(s string) string { return strings.ReplaceAll(s, "|", `\|`) }

func fmtRatio(v float64) string { return fmt.Sprintf("%.2f", v) }

func fmtRate(v float64) string {
	switch {
	case v >= 10000:
		return fmt.Sprintf("%.1fk/s", v/1000)
	case v >= 1000:
		return fmt.Sprintf("%.2fk/s", v/1000)
	}
	return fmt.Sprintf("%.0f/s", v)
}

func fmtMS(v float64) string {
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f ms", v)
	case v >= 10:
		return fmt.Sprintf("%.1f ms", v)
	}
	return fmt.Sprintf("%.2f ms", v)
}

func fmtMiB(v float64) string { return fmt.Sprintf("%.1f MiB", v/(1<<20)) }

// rotate returns the round-th rotation of xs, so that in every round a
// different contender goes first and drift in the machine's load spreads
// over all of them instead of favouring one.
func rotate[T any](xs []T, round int) []T {
	if len(xs) == 0 {
		return xs
	}
	k := round % len(xs)
	return append(slices.Clone(xs[k:]), xs[:k]...)
}
