// Package ctlabi is the public interface of a mount's control directory,
// MOUNTPOINT/.kvtier/, and of the Prometheus metrics derived from it: the
// file names, the JSON of stats.json and the request and answer of match.
// The daemon (fusefs) writes these types, `kvtierfs stat` and the tests
// read them; a field or metric renamed here breaks every reader, so add,
// never rename. It imports only the standard library: every package may
// import it (staging/match for the match wire format), and it imports none.
//
// # The control directory
//
// Dir (.kvtier) sits at the mount root, mode 0700, owned by the engine's
// uid. Its files open only for that uid and root (DESIGN "Threat model").
//
// # stats.json
//
// StatsFile is read-only. Each open takes one snapshot of the mount, a
// Stats; read it to the end and decode it. Counters count since the mount,
// disk and staging are occupancy now, descriptors the daemon's file
// descriptors now. Warnings lists the failures the
// operator should act on; each has a stable Code (the Warn* constants) and
// a message that names the evidence and what to do.
//
//	{"mountpoint":"/mnt/kv","disk":{…},"groups":{"0":{…}},"descriptors":{…},
//	 "primary":{"regions":[…],"ignored":[]},"counters":{"lookups":12,…},
//	 "staging":{…},"peers":[],"warnings":[{"code":"no_space","message":"…"}]}
//
// # match
//
// MatchFile answers the engine's whole-prompt lookup in one round trip:
// open it read-write, write one request (EncodeMatchRequest), then read the
// answer on the same descriptor (DecodeMatchResult). The request lists the
// chunk keys of each KV cache group; the answer is the hit vLLM's scheduler
// would compute, probing the index only: a match stages and pins nothing.
// Requests are bounded by MaxRequestBytes, MaxRequestKeys and
// MaxRequestGroups.
//
// # Metrics
//
// Metrics lists every number of Stats exported to Prometheus, with its
// metric name and help; warnings are exported as kvtierfs_warning{code},
// one series per code of WarningCodes.
//
// # Adding a number to stats.json
//
// Every section of stats.json is a type of this package; the packages that
// count (tiers/disk, tiers/shm, tiers/shared, sync/rowsync, staging) return
// plain stats of their own, without JSON tags, and one function,
// tiers/tier's Stats.Snapshot, copies them in and raises every warning (the
// mount, fusefs.FS.Stats, hands it only the counters it keeps itself). To
// add a number: add its field, with its JSON name, to the section here and
// its line to Metrics (TestEveryStatHasAMetric fails until it has one), and
// to the golden testdata/stats.json; then fill it where its part's stats
// are copied in (tiers/tier/stats.go; a counter of fusefs or fusefs/core,
// in fusefs/stats.go), and rewrite the bytes a mount serves, with
// go test ./fusefs -run TestStatsFileBytesGolden -update. The sections
// copied by conversion (Group, Phase, Region, IgnoredFile, Peer,
// Replication, Staging) have their part's fields one for one, so a field
// added on one side only does not compile; TestABISectionsCopyEveryField
// holds the copied ones (Disk, Shared) complete.
package ctlabi
