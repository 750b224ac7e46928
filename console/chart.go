package console

import (
	"fmt"
	"html/template"
	"strings"
)

// Chart geometry, in SVG user units.
const (
	chartW, chartH      = 1100, 170
	chartLeft, chartTop = 44, 10
	chartBottom         = 22
)

// chart draws the hour's buckets as an inline SVG bar chart: one bar per minute, the sent
// (published or completed) part in blue, the failed part stacked on it in red. Every value
// written is a number or a fixed string, so the markup needs no escaping.
func chart(label string, buckets []RateBucket) template.HTML {
	var peak int64
	var sent, failed int64
	for _, b := range buckets {
		peak = max(peak, b.Sent+b.Failed)
		sent += b.Sent
		failed += b.Failed
	}
	top := niceCeil(peak)
	plotW := float64(chartW - chartLeft - 4)
	plotH := float64(chartH - chartTop - chartBottom)
	var sb strings.Builder
	fmt.Fprintf(&sb, `<svg class="chart" viewBox="0 0 %d %d" role="img" aria-label="%s per minute over the last hour: %d ok, %d failed">`,
		chartW, chartH, template.HTMLEscapeString(label), sent, failed)
	for _, f := range []float64{0, 0.5, 1} {
		y := float64(chartTop) + plotH*(1-f)
		fmt.Fprintf(&sb, `<line class="grid" x1="%d" y1="%.1f" x2="%d" y2="%.1f"/>`, chartLeft, y, chartW-4, y)
		fmt.Fprintf(&sb, `<text class="axis" x="%d" y="%.1f" text-anchor="end">%g</text>`, chartLeft-6, y+4, float64(top)*f)
	}
	n := len(buckets)
	if n > 0 {
		slot := plotW / float64(n)
		bw := max(slot-1.5, 1)
		for i, b := range buckets {
			x := float64(chartLeft) + float64(i)*slot + 0.75
			hs := plotH * float64(b.Sent) / float64(top)
			hf := plotH * float64(b.Failed) / float64(top)
			base := float64(chartTop) + plotH
			if b.Sent > 0 {
				fmt.Fprintf(&sb, `<rect class="ok" x="%.1f" y="%.1f" width="%.1f" height="%.1f"><title>%s: %d ok</title></rect>`,
					x, base-hs, bw, hs, b.Minute.Format("15:04"), b.Sent)
			}
			if b.Failed > 0 {
				fmt.Fprintf(&sb, `<rect class="bad" x="%.1f" y="%.1f" width="%.1f" height="%.1f"><title>%s: %d failed</title></rect>`,
					x, base-hs-hf, bw, max(hf, 1), b.Minute.Format("15:04"), b.Failed)
			}
		}
		for _, i := range []int{0, n / 2, n - 1} {
			anchor := "middle"
			switch i {
			case 0:
				anchor = "start"
			case n - 1:
				anchor = "end"
			}
			x := float64(chartLeft) + float64(i)*slot
			if i == n-1 {
				x += slot
			}
			fmt.Fprintf(&sb, `<text class="axis" x="%.1f" y="%d" text-anchor="%s">%s</text>`, x, chartH-6, anchor, buckets[i].Minute.Format("15:04"))
		}
	}
	sb.WriteString(`</svg>`)
	return template.HTML(sb.String())
}

// niceCeil rounds n up to 1, 2 or 5 times a power of ten (at least 1).
func niceCeil(n int64) int64 {
	if n <= 1 {
		return 1
	}
	for p := int64(1); ; p *= 10 {
		for _, m := range []int64{1, 2, 5} {
			if m*p >= n {
				return m * p
			}
		}
	}
}
