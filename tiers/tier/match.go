package tier

import (
	"github.com/kvtierfs/kvtierfs/fusefs/ctlabi"
	"github.com/kvtierfs/kvtierfs/staging/match"
	"github.com/kvtierfs/kvtierfs/tiers/block"
)

// matchThreadBit marks the thread ids of matches (MatchThread), apart from
// the kernel's thread ids.
const matchThreadBit = 1 << 31

// MatchThread numbers a new match descriptor: its probes are one thread's
// lookups (a lookup batch of their own), whose id has matchThreadBit set.
func (t *Tier) MatchThread() uint32 { return t.matchThreads.Add(1) | matchThreadBit }

// Match answers one encoded match request (ctlabi.MatchFile) probed by
// thread, and returns the encoded answer ending in a newline: a key is
// present when a level holds its block and a load of it could be served now
// (ServesLoads, asked once). Each probe counts as a lookup (protection,
// chains, diagnostics) as the engine's lookups do, past the lookup budget,
// which stops deciding the request's tier: an engine that matches here loads
// its hit in waves.
func (t *Tier) Match(request []byte, thread uint32) []byte {
	req, err := ctlabi.DecodeMatchRequest(request)
	if err != nil {
		return ctlabi.EncodeMatchResult(ctlabi.MatchResult{}, err)
	}
	serving := t.ServesLoads()
	if t.cfg.Budget != nil {
		t.cfg.Budget.Exempt(req.Tier)
	}
	res, err := match.Hit(req, func(group int, key string) bool {
		found, _ := t.find(block.Name{Tier: req.Tier, Group: group, Hash: key}.Ref(), thread, false)
		return found && serving
	})
	t.matches.Add(1)
	return append(ctlabi.EncodeMatchResult(res, err), '\n')
}

// Matches counts the match requests answered.
func (t *Tier) Matches() int64 { return t.matches.Load() }
