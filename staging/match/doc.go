// Package match answers the engine's lookup of a whole prompt (issue 4,
// "Batched matching"): Hit computes the engine's hit in one call under
// vLLM's lookup rules (prefix scan for full attention, backward run search
// for sliding-window groups, tail+1-then-drop-one for unverified EAGLE
// groups, ANDed across groups until stable), probing only the filesystem's
// index, so a lookup never stages or pins anything. The request, its limits
// and its wire format (the control file MOUNTPOINT/.kvtier/match) are
// fusefs/ctlabi's. Retained is the store-side rule that makes windowed
// groups, EAGLE groups in particular, able to hit at all (DESIGN §3,
// failure 1); StockRetained is the engine's old rule that never lets an
// EAGLE group hit.
package match
