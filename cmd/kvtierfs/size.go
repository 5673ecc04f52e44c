package main

import (
	"fmt"
	"strconv"
	"strings"
)

// sizeUnits maps size suffixes to multipliers: binary (powers of 1024) for
// K/M/G/T, the Ki/Mi/Gi/Ti of Kubernetes and the KiB/MiB/GiB/TiB of stat's
// output; decimal (powers of 1000) only for the SI KB/MB/GB/TB.
var sizeUnits = []struct {
	suffix string
	mult   float64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
	{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30}, {"Ti", 1 << 40},
	{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
	{"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"T", 1 << 40},
	{"B", 1},
}

// sizeHelp says how sizes are read, for the error of a bad one.
const sizeHelp = "want a positive size such as 400GiB, 400Gi or 400G (all 400×2^30 bytes), 500MB (500×10^6) or a byte count"

// parseSize parses sizes such as 400GiB, 400Gi, 10G, 1.5TB or 4096.
func parseSize(flag, s string) (int64, error) {
	t := strings.TrimSpace(s)
	mult := 1.0
	for _, u := range sizeUnits {
		if len(t) > len(u.suffix) && strings.EqualFold(t[len(t)-len(u.suffix):], u.suffix) {
			mult = u.mult
			t = strings.TrimSpace(t[:len(t)-len(u.suffix)])
			break
		}
	}
	v, err := strconv.ParseFloat(t, 64)
	if err != nil || !(v > 0 && v*mult <= 1<<62) { // also refuses NaN
		return 0, fmt.Errorf("--%s %q: %s", flag, s, sizeHelp)
	}
	return int64(v * mult), nil
}

// formatBytes prints a byte count in binary units.
func formatBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// plural is n and the noun, singular for 1: plural(1, "block") is "1
// block", plural(2, "block") "2 blocks".
func plural(n int64, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
