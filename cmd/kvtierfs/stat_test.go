package main

import (
	"bytes"
	"regexp"
	"testing"

	"github.com/kvtierfs/kvtierfs/fusefs/ctlabi"
)

// TestStatLinesOfDescriptorsAndChangedBlocks: stat names the daemon's
// descriptors, those kept for its own work and the opens refused, and,
// once a block failed after a change in the store tree, a line of its own
// beside the checksum failures; neither line appears without its figures.
func TestStatLinesOfDescriptorsAndChangedBlocks(t *testing.T) {
	var out bytes.Buffer
	printStats(&out, ctlabi.Stats{Descriptors: ctlabi.Descriptors{Open: 300, Limit: 1000, Kept: 250},
		Counters: ctlabi.Counters{OpensRefused: 1, ChecksumFailures: 3, BlocksChangedOutside: 2}})
	for _, want := range []string{
		`(?m)^descriptors +300 open of 1000 allowed, 250 kept for the daemon's own work, 1 open through the mount refused$`,
		`(?m)^checksum failures +3$`,
		`(?m)^changed outside +2 blocks failed their checksum after their files were changed in the store tree, outside the daemon$`,
	} {
		if !regexp.MustCompile(want).Match(out.Bytes()) {
			t.Errorf("stat output lacks %s:\n%s", want, out.String())
		}
	}
	out.Reset()
	printStats(&out, ctlabi.Stats{})
	if regexp.MustCompile(`(?m)^(descriptors|changed outside) `).Match(out.Bytes()) {
		t.Errorf("stat of no descriptors counted and no block changed outside:\n%s", out.String())
	}
}
