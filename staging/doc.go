// Package staging stages the blocks that follow a read into RAM (wave
// staging, issue 4, DESIGN §3 failure 3), so the engine's next loads are
// served from memory; it needs neither FUSE nor I/O. Batched matching is
// staging/match, the field diagnostics staging/diagnose.
package staging
