// Package engine is a model of vLLM's KV offloading data path with an `fs`
// secondary tier, driving real kvtierfs mounts: the end-to-end harness of the
// project and the engine behind `kvtierfs bench`.
//
// # What is modelled
//
// A cluster has one to four nodes. Each node is a `kvtierfs mount` daemon with
// its own store and mount, and its own shm region
// /dev/shm/vllm_offload_<id>_<node>.mmap (rows × row bytes, no header). The
// TP ranks are spread over the nodes; rank r writes slot (local GPU index %
// world size) of a row of its own node's region, so with one GPU per node every
// rank writes slot 0 and the other slots stay zero (DESIGN §2).
//
// The scheduler runs on the head node (node 0). It hashes prompts into chained
// chunk keys (sha256 of parent hash, token ids and the hash seed, in hex), keeps
// the primary (CPU) tier as rows with LRU order and reference counts, and does
// the disk tier's I/O through the head's mount exactly as the engine does
// (package engineio: O_DIRECT probe, tmp + one write + rename, faccessat, one
// O_DIRECT readv into a shm row, close; 16 threads). The other nodes' mounts see
// no engine I/O: they exist for row mirroring (`--sync on`).
//
// Workers, one per rank, do the GPU side: GPU→CPU stores write deterministic KV
// bytes for a chunk into their slot of a row on their own node (the same bytes
// on every rank for MLA, rank-dependent for GQA); CPU→GPU loads copy the slot of
// each loaded row to the rank's device through package gpu and compare the
// device's fingerprint with the expected KV of that chunk and rank. A row is
// identical when every rank's GPU holds the right KV, so stale rows are caught
// where they would hurt.
//
// # Engine behaviours
//
// EngineStock is the engine as the field report found it. Its store filter
// keeps only {acc-tail … acc-1} of each alignment segment of a windowed group,
// EAGLE included (match.StockRetained). Each step of its lookup walks every
// key of every group in prefix order, as the manager's lookup does, and
// confirms a key by promoting it: a key resident in the primary tier is a hit;
// a key on disk reserves a primary row for its promotion (RETRY); a key on
// disk with no row left, or absent, is a MISS. The engine's match rule then
// runs on the hits and RETRYs. A vetoed lookup (hit 0) drops its reservations
// unread (this model's choice: the "0 bytes read back"); otherwise the
// reserved rows are promoted and the lookup runs again at the next step until
// nothing is left to promote. Once the primary tier is full, keys on disk
// answer MISS and the AND of the groups vetoes the hit, with the summed RETRY
// of the step pinned at the row count (DESIGN §3, failures 1 and 3).
//
// EngineUpstream is vLLM main today (upstream.go): the EAGLE store filter
// fixed (match.Retained), and the scheduler's walk over the tiering manager:
// asynchronous fs lookups (every new key RETRY at first, its verdict kept
// while a request that asked is active, one faccessat batch per step, each
// request's keys together), a key on disk starting a promotion into a free
// or least recently used ready row (HIT_PENDING) or MISS when no row is
// left, full-attention groups from the start and window groups from the
// end, the convergence loop, EAGLE's extra chunk, _touch after each lookup,
// and "ask again" while any key is pending, counted parked after 40 steps.
// Requests that arrive together (Config.AtOnce) share the steps and rows.
//
// EngineFixed keeps {0} ∪ {acc-tail … acc-1} for EAGLE groups
// (match.Retained), matches without staging (one request to the mount's
// .kvtier/match), then stages the blocks the hit needs in waves sized to
// the rows that can be allocated, loads each wave to the GPUs and releases
// its rows before the next.
//
// The mounts run with --lookup-budget auto unless Config.LookupBudget is
// off: for stock and upstream the mount then answers present only for the
// keys the primary tier can promote at once (issue 23).
//
// A load that fails (the engine deletes the file) drops the request's
// external hit: the engine recomputes it. A wrong row raises nothing, as in the
// field; it only shows in RowsIdentical.
package engine
