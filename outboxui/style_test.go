package outboxui

import (
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// palette reads the custom properties of style.css: the light theme (the
// first :root block) and the dark one (the :root block inside the
// prefers-color-scheme: dark query). Colours are #rrggbb.
func palette(t *testing.T) (light, dark map[string]string) {
	t.Helper()
	css, err := files.ReadFile("static/style.css")
	if err != nil {
		t.Fatal(err)
	}
	src := string(css)
	block := func(from int) (string, int) {
		i := strings.Index(src[from:], ":root {")
		if i < 0 {
			t.Fatalf("no :root block after offset %d", from)
		}
		start := from + i + len(":root {")
		end := strings.IndexByte(src[start:], '}')
		if end < 0 {
			t.Fatal("unclosed :root block")
		}
		return src[start : start+end], start + end
	}
	lightSrc, after := block(0)
	q := strings.Index(src, "@media (prefers-color-scheme: dark)")
	if q < 0 || q < after {
		t.Fatal("no dark theme (@media (prefers-color-scheme: dark)) after the light :root block")
	}
	darkSrc, _ := block(q)
	return vars(t, lightSrc), vars(t, darkSrc)
}

var varRE = regexp.MustCompile(`--([a-z-]+):\s*([^;]+);`)

func vars(t *testing.T, block string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, m := range varRE.FindAllStringSubmatch(block, -1) {
		out[m[1]] = strings.TrimSpace(m[2])
	}
	return out
}

// luminance is a #rrggbb colour's relative luminance (WCAG 2.x).
func luminance(hex string) (float64, error) {
	if len(hex) != 7 || hex[0] != '#' {
		return 0, fmt.Errorf("colour %q: want #rrggbb", hex)
	}
	var c [3]float64
	for i := range c {
		v, err := strconv.ParseUint(hex[1+2*i:3+2*i], 16, 8)
		if err != nil {
			return 0, fmt.Errorf("colour %q: %w", hex, err)
		}
		s := float64(v) / 255
		if s <= 0.04045 {
			c[i] = s / 12.92
		} else {
			c[i] = math.Pow((s+0.055)/1.055, 2.4)
		}
	}
	return 0.2126*c[0] + 0.7152*c[1] + 0.0722*c[2], nil
}

// contrast is WCAG's contrast ratio of two colours, 1 to 21.
func contrast(a, b string) (float64, error) {
	la, err := luminance(a)
	if err != nil {
		return 0, err
	}
	lb, err := luminance(b)
	if err != nil {
		return 0, err
	}
	if la < lb {
		la, lb = lb, la
	}
	return (la + 0.05) / (lb + 0.05), nil
}

func TestContrastFormula(t *testing.T) {
	for _, c := range []struct {
		a, b string
		want float64
	}{
		{"#000000", "#ffffff", 21},
		{"#ffffff", "#ffffff", 1},
		{"#777777", "#ffffff", 4.48}, // the well-known just-failing grey
		{"#767676", "#ffffff", 4.54}, // and the just-passing one
	} {
		got, err := contrast(c.a, c.b)
		if err != nil {
			t.Fatal(err)
		}
		if math.Abs(got-c.want) > 0.01 {
			t.Errorf("contrast(%s, %s) = %.3f, want %.2f", c.a, c.b, got, c.want)
		}
	}
}

// TestPalette checks that both themes of style.css define the palette
// overview.css and the pages use, and that every pair of colours the pages
// put text on meets WCAG AA for normal text (4.5:1), and the focus ring and
// the controls' borders the 3:1 of non-text contrast, in both themes.
func TestPalette(t *testing.T) {
	light, dark := palette(t)
	required := []string{"bg", "fg", "muted", "border", "link", "pending", "sent", "failed", "card-bg"}
	text := 4.5
	ui := 3.0
	pairs := []struct {
		fg, bg string
		min    float64
	}{
		// text on the page, panels and table headings
		{"fg", "bg", text}, {"fg", "card-bg", text}, {"fg", "head", text},
		{"muted", "bg", text}, {"muted", "card-bg", text}, {"muted", "head", text},
		{"link", "bg", text}, {"link", "card-bg", text}, {"link", "head", text},
		// the status colours as text (last errors, ticks) and as badges
		{"pending", "card-bg", text}, {"sent", "card-bg", text}, {"failed", "card-bg", text},
		{"pending", "bg", text}, {"sent", "bg", text}, {"failed", "bg", text},
		{"failed", "head", text},
		{"on-status", "pending", text}, {"on-status", "sent", text}, {"on-status", "failed", text},
		// buttons, the top bar, messages
		{"button-fg", "button-bg", text},
		{"header-fg", "header-bg", text}, {"header-muted", "header-bg", text},
		{"fg", "ok-bg", text}, {"fg", "err-bg", text}, {"link", "ok-bg", text},
		{"fg", "warn-bg", text}, {"link", "warn-bg", text},
		// non-text: the focus ring, the controls' edges
		{"focus", "bg", ui}, {"focus", "card-bg", ui}, {"focus", "head", ui},
		{"control-border", "card-bg", ui}, {"control-border", "bg", ui},
	}
	for theme, p := range map[string]map[string]string{"light": light, "dark": dark} {
		for _, name := range required {
			if p[name] == "" {
				t.Errorf("%s theme: no --%s", theme, name)
			}
		}
		for _, c := range pairs {
			fg, bg := p[c.fg], p[c.bg]
			if fg == "" || bg == "" {
				t.Errorf("%s theme: --%s or --%s is not defined", theme, c.fg, c.bg)
				continue
			}
			r, err := contrast(fg, bg)
			if err != nil {
				t.Errorf("%s theme: --%s on --%s: %v", theme, c.fg, c.bg, err)
				continue
			}
			if r < c.min {
				t.Errorf("%s theme: --%s %s on --%s %s: contrast %.2f:1, want at least %.1f:1", theme, c.fg, fg, c.bg, bg, r, c.min)
			} else {
				t.Logf("%s theme: --%s on --%s: %.2f:1", theme, c.fg, c.bg, r)
			}
		}
	}
	// The two themes differ where it matters.
	if light["bg"] == dark["bg"] || light["fg"] == dark["fg"] {
		t.Errorf("the dark theme keeps the light one's --bg or --fg")
	}
	for name := range light {
		if _, ok := dark[name]; !ok {
			t.Errorf("--%s has no dark value", name)
		}
	}
}
