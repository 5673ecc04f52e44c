package core

// spans is a set of byte ranges [start, end), kept sorted and merged.
type spans []span

type span struct{ start, end int64 }

// add inserts [start, end).
func (s *spans) add(start, end int64) {
	if start >= end {
		return
	}
	out := (*s)[:0:0]
	for _, r := range *s {
		switch {
		case r.end < start || r.start > end:
			out = append(out, r)
		default:
			start, end = min(start, r.start), max(end, r.end)
		}
	}
	out = append(out, span{start, end})
	for i := len(out) - 1; i > 0 && out[i].start < out[i-1].start; i-- {
		out[i], out[i-1] = out[i-1], out[i]
	}
	*s = out
}

// covers reports whether [start, end) lies within the set.
func (s spans) covers(start, end int64) bool {
	if start >= end {
		return true
	}
	for _, r := range s {
		if r.start <= start && end <= r.end {
			return true
		}
	}
	return false
}

// prefix is the length of the run of the set that starts at 0.
func (s spans) prefix() int64 {
	if len(s) > 0 && s[0].start == 0 {
		return s[0].end
	}
	return 0
}
