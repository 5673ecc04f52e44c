package ctlabi

import (
	"unicode/utf8"
)

// decodeRequestFast parses a match request of the shape engines write (see
// the format above DecodeMatchRequest's types) in one pass without
// reflection: the field's 12,434 keys took encoding/json 8 ms, most of a
// batched match. It accepts only what encoding/json decodes to the same
// wireRequest: exact field names, each at most once, no null, integers
// without fraction or exponent, strings without escapes, control bytes or
// invalid UTF-8, white space only after the object. Anything else reports
// false, and the caller decodes with encoding/json, which gives the answer
// or the precise error.
func decodeRequestFast(b []byte) (wireRequest, bool) {
	p := fastParser{s: string(b)}
	var w wireRequest
	var seenTier, seenGroups bool
	ok := p.object(func(field string) bool {
		switch {
		case field == "tier" && !seenTier:
			seenTier = true
			var ok bool
			w.Tier, ok = p.str()
			return ok
		case field == "groups" && !seenGroups:
			seenGroups = true
			w.Groups = []wireGroup{}
			return p.list('[', ']', func() bool {
				g, ok := p.group()
				w.Groups = append(w.Groups, g)
				return ok
			})
		}
		return false
	})
	p.space()
	return w, ok && p.i == len(p.s)
}

// fastParser reads JSON from s; i is the next byte.
type fastParser struct {
	s string
	i int
}

// group reads one object of the groups array.
func (p *fastParser) group() (wireGroup, bool) {
	var g wireGroup
	var seenGroup, seenKind, seenTail, seenAcc, seenKeys bool
	once := func(seen *bool) bool {
		first := !*seen
		*seen = true
		return first
	}
	ok := p.object(func(field string) bool {
		var ok bool
		switch {
		case field == "group" && once(&seenGroup):
			var v int
			v, ok = p.integer()
			g.Group = &v
		case field == "kind" && once(&seenKind):
			g.Kind, ok = p.str()
		case field == "tail" && once(&seenTail):
			g.Tail, ok = p.integer()
		case field == "acc" && once(&seenAcc):
			g.Acc, ok = p.integer()
		case field == "keys" && once(&seenKeys):
			g.Keys = []string{}
			ok = p.list('[', ']', func() bool {
				k, ok := p.str()
				g.Keys = append(g.Keys, k)
				return ok
			})
		}
		return ok
	})
	return g, ok
}

// object reads {"name": value, ...}, calling value for each field with the
// parser at the value.
func (p *fastParser) object(value func(field string) bool) bool {
	p.space()
	return p.list('{', '}', func() bool {
		field, ok := p.str()
		if !ok {
			return false
		}
		p.space()
		if !p.take(':') {
			return false
		}
		p.space()
		return value(field)
	})
}

// list reads open, then items separated by commas, then close, calling item
// with the parser at each item.
func (p *fastParser) list(open, close byte, item func() bool) bool {
	if !p.take(open) {
		return false
	}
	p.space()
	if p.take(close) {
		return true
	}
	for {
		p.space()
		if !item() {
			return false
		}
		p.space()
		if p.take(close) {
			return true
		}
		if !p.take(',') {
			return false
		}
	}
}

// str reads a string without escapes or control bytes, in valid UTF-8.
func (p *fastParser) str() (string, bool) {
	if !p.take('"') {
		return "", false
	}
	start := p.i
	for p.i < len(p.s) {
		c := p.s[p.i]
		switch {
		case c == '"':
			v := p.s[start:p.i]
			p.i++
			return v, utf8.ValidString(v)
		case c == '\\' || c < 0x20:
			return "", false
		}
		p.i++
	}
	return "", false
}

// integer reads -?(0|[1-9][0-9]*) of at most 18 digits, followed by a byte
// that cannot continue a number.
func (p *fastParser) integer() (int, bool) {
	neg := p.take('-')
	start := p.i
	v := 0
	for p.i < len(p.s) && p.s[p.i] >= '0' && p.s[p.i] <= '9' {
		v = v*10 + int(p.s[p.i]-'0')
		p.i++
	}
	digits := p.i - start
	if digits == 0 || digits > 18 || (digits > 1 && p.s[start] == '0') {
		return 0, false
	}
	if p.i < len(p.s) {
		if c := p.s[p.i]; c == '.' || c == 'e' || c == 'E' {
			return 0, false
		}
	}
	if neg {
		v = -v
	}
	return v, true
}

// take consumes c if it is next.
func (p *fastParser) take(c byte) bool {
	if p.i < len(p.s) && p.s[p.i] == c {
		p.i++
		return true
	}
	return false
}

// space skips JSON white space.
func (p *fastParser) space() {
	for p.i < len(p.s) {
		switch p.s[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}
