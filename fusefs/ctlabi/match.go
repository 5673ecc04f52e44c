package ctlabi

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// GroupKind is the attention type of a KV cache group; it decides which chunks
// a hit needs from that group.
type GroupKind int

const (
	// KindFull is full attention: a hit of h chunks needs chunks 0 … h-1.
	KindFull GroupKind = iota + 1
	// KindSliding is a sliding window of Tail chunks: a hit of h chunks needs
	// chunks max(0, h-Tail) … h-1.
	KindSliding
	// KindEagle is an EAGLE/MTP draft group with a sliding window of Tail
	// chunks: unverified, it needs a run of Tail+1 chunks and drops the last.
	KindEagle
)

var kindNames = map[GroupKind]string{KindFull: "full", KindSliding: "sliding", KindEagle: "eagle"}

// String returns the wire name of the kind: "full", "sliding" or "eagle".
func (k GroupKind) String() string {
	if name, ok := kindNames[k]; ok {
		return name
	}
	return "GroupKind(" + strconv.Itoa(int(k)) + ")"
}

// ParseGroupKind parses a wire name ("full", "sliding", "eagle") into a kind.
func ParseGroupKind(name string) (GroupKind, error) {
	for kind, kindName := range kindNames {
		if name == kindName {
			return kind, nil
		}
	}
	return 0, fmt.Errorf("unknown group kind %s (want full, sliding or eagle)", quoteShort(name))
}

// GroupSpec is one KV cache group of a match request.
type GroupSpec struct {
	// Group is the engine's KV cache group index: the N of the `_g<N>`
	// directory its blocks live in.
	Group int
	// Kind is the group's attention type.
	Kind GroupKind
	// Tail is the sliding window in chunks (vLLM's
	// sliding_window_size_in_chunks); 0 for full attention.
	Tail int
	// Acc is the alignment segment in chunks (vLLM's alignment_chunk_count)
	// the engine's store filter works on, at least Tail; 0 for full
	// attention. It decides what the engine stores (see Retained), not how a
	// lookup reads, so Match only validates it.
	Acc int
	// Keys are the chunk hashes in lowercase hex, one per complete chunk of
	// the prompt, in chunk order.
	Keys []string
}

// MatchRequest asks for the engine's hit over one prompt.
type MatchRequest struct {
	// Tier is the engine's tier directory name under the mount root, e.g.
	// "DeepSeek_abc123def456_r0"; block.Name.Path places the keys under it.
	Tier string
	// Groups are the KV cache groups, each with the keys of every chunk.
	Groups []GroupSpec
}

// MatchResult is the answer to a MatchRequest.
type MatchResult struct {
	// HitChunks is the number of leading chunks the engine can load: the
	// hit with every group ANDed, 0 when any group vetoes. In tokens the
	// engine takes min(HitChunks × tokens per chunk, its token bound).
	HitChunks int `json:"hit_chunks"`
	// PerGroup[i] is the hit Groups[i] would allow on its own, which tells
	// which group limits or vetoes HitChunks.
	PerGroup []int `json:"per_group"`
	// Probes is the number of distinct (group, chunk) presence checks made.
	Probes int `json:"probes"`
}

// Request limits, so that one request costs bounded memory and CPU (DESIGN
// "Threat model"). Validate enforces them, DecodeMatchRequest checks the
// size first. A 242k-token prefix in the field queried 12,434 keys per
// group; models have a handful of KV cache groups. 16 MiB holds the
// largest request of MaxRequestKeys 64-digit keys in JSON.
const (
	// MaxRequestBytes bounds the JSON request: 16 MiB.
	MaxRequestBytes = 16 << 20
	// MaxRequestKeys bounds the keys of a request, summed over its groups.
	MaxRequestKeys = 1 << 18
	// MaxRequestGroups bounds the KV cache groups of a request.
	MaxRequestGroups = 64
)

// Key and tier name bounds. Keys must have the 5 digits block.Name.Path splits off;
// vLLM's hashes have 32 or 64. A tier is one directory name (NAME_MAX).
const (
	minKeyDigits = 5
	maxKeyDigits = 128
	maxTierBytes = 255
)

// RequestError reports an invalid match request. Field is the offending
// field as a JSON path, such as "groups[1].tail" or "groups[0].keys[7]".
type RequestError struct {
	Field  string
	Reason string
}

// Error returns "match request: <field>: <reason>".
func (e *RequestError) Error() string {
	return "match request: " + e.Field + ": " + e.Reason
}

// ErrRequestTooLarge is wrapped by the error for a request beyond
// MaxRequestBytes or MaxRequestKeys.
var ErrRequestTooLarge = errors.New("match request too large")

// Validate checks a request: a tier that is one directory name; one to
// MaxRequestGroups groups; unique non-negative group ids; a known kind; tail and acc 0 for full
// attention, and 0 < tail <= acc for sliding and EAGLE groups; the same
// number of keys in every group; every key lowercase hex of 5 to 128 digits;
// at most MaxRequestKeys keys in all.
func (r MatchRequest) Validate() error {
	if err := validateTier(r.Tier); err != nil {
		return err
	}
	if len(r.Groups) == 0 {
		return &RequestError{"groups", "no groups"}
	}
	if len(r.Groups) > MaxRequestGroups {
		return fmt.Errorf("%w: %d groups (limit %d)", ErrRequestTooLarge, len(r.Groups), MaxRequestGroups)
	}
	totalKeys := 0
	for _, g := range r.Groups {
		totalKeys += len(g.Keys)
	}
	if totalKeys > MaxRequestKeys {
		return fmt.Errorf("%w: %d keys (limit %d)", ErrRequestTooLarge, totalKeys, MaxRequestKeys)
	}
	indexOfGroup := make(map[int]int, len(r.Groups))
	for i, g := range r.Groups {
		field := "groups[" + strconv.Itoa(i) + "]"
		if g.Group < 0 {
			return &RequestError{field + ".group", fmt.Sprintf("negative group id %d", g.Group)}
		}
		if first, dup := indexOfGroup[g.Group]; dup {
			return &RequestError{field + ".group", fmt.Sprintf("duplicate group id %d (also groups[%d])", g.Group, first)}
		}
		indexOfGroup[g.Group] = i
		if err := validateWindow(field, g); err != nil {
			return err
		}
		if len(g.Keys) != len(r.Groups[0].Keys) {
			return &RequestError{field + ".keys", fmt.Sprintf("%d keys, but groups[0] has %d", len(g.Keys), len(r.Groups[0].Keys))}
		}
		for j, key := range g.Keys {
			if reason := checkKey(key); reason != "" {
				return &RequestError{field + ".keys[" + strconv.Itoa(j) + "]", reason}
			}
		}
	}
	return nil
}

func validateTier(tier string) error {
	switch {
	case tier == "":
		return &RequestError{"tier", "empty"}
	case len(tier) > maxTierBytes:
		return &RequestError{"tier", fmt.Sprintf("%d bytes, longer than a directory name can be (%d)", len(tier), maxTierBytes)}
	case tier == "." || tier == ".." || strings.ContainsAny(tier, "/\x00"):
		return &RequestError{"tier", fmt.Sprintf("%s is not a single directory name", quoteShort(tier))}
	}
	return nil
}

func validateWindow(field string, g GroupSpec) error {
	switch g.Kind {
	case KindFull:
		if g.Tail != 0 {
			return &RequestError{field + ".tail", fmt.Sprintf("must be 0 for a full group, got %d", g.Tail)}
		}
		if g.Acc != 0 {
			return &RequestError{field + ".acc", fmt.Sprintf("must be 0 for a full group, got %d", g.Acc)}
		}
	case KindSliding, KindEagle:
		if g.Tail <= 0 {
			return &RequestError{field + ".tail", fmt.Sprintf("must be > 0 for a %s group, got %d", g.Kind, g.Tail)}
		}
		if g.Acc < g.Tail {
			return &RequestError{field + ".acc", fmt.Sprintf("%d is less than tail %d", g.Acc, g.Tail)}
		}
	default:
		return &RequestError{field + ".kind", fmt.Sprintf("unknown kind %s (want full, sliding or eagle)", g.Kind)}
	}
	return nil
}

// checkKey returns why key is not a chunk key, or "" when it is one.
func checkKey(key string) string {
	if len(key) < minKeyDigits || len(key) > maxKeyDigits {
		return fmt.Sprintf("%s has %d digits, want %d to %d", quoteShort(key), len(key), minKeyDigits, maxKeyDigits)
	}
	for i := 0; i < len(key); i++ {
		if !isLowerHex[key[i]] {
			return fmt.Sprintf("%s is not lowercase hex", quoteShort(key))
		}
	}
	return ""
}

// isLowerHex[c] reports whether byte c is a lowercase hex digit.
var isLowerHex = func() (table [256]bool) {
	for _, c := range "0123456789abcdef" {
		table[c] = true
	}
	return table
}()

// quoteShort quotes s for an error message, cut to a readable length.
func quoteShort(s string) string {
	const limit = 80
	if len(s) > limit {
		return strconv.Quote(s[:limit]) + "…"
	}
	return strconv.Quote(s)
}
