package ctlabi

import (
	"fmt"
	"testing"
)

// BenchmarkDecodeMatchRequest decodes the field's match request: 12,434
// keys of one full-attention group, as the control file receives it.
func BenchmarkDecodeMatchRequest(b *testing.B) {
	keys := make([]string, 12434)
	for i := range keys {
		keys[i] = fmt.Sprintf("%064x", i+1)
	}
	raw, err := EncodeMatchRequest(MatchRequest{Tier: "Model_0123456789ab_r0", Groups: []GroupSpec{{Group: 0, Kind: KindFull, Keys: keys}}})
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(raw)))
	for b.Loop() {
		if _, err := DecodeMatchRequest(raw); err != nil {
			b.Fatal(err)
		}
	}
}
