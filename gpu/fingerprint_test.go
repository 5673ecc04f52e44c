package gpu

import (
	"encoding/binary"
	"testing"
)

// TestMix64MatchesSplitMix64 anchors mix64 to SplitMix64's published outputs
// for seed 0 (state k·γ, k = 1, 2, 3).
func TestMix64MatchesSplitMix64(t *testing.T) {
	for k, want := range []uint64{0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F} {
		if got := mix64(uint64(k+1) * fpGamma); got != want {
			t.Errorf("mix64(%d·γ) = %#016x, want %#016x", k+1, got, want)
		}
	}
}

// TestFingerprintGolden freezes kvtier-fp1: ranks built from different
// versions must agree. The values were checked against an independent
// implementation of the definition (Python).
func TestFingerprintGolden(t *testing.T) {
	row := make([]byte, 4096+5)
	fillRandom(row, 1)
	for _, c := range []struct {
		in   []byte
		want uint64
	}{
		{nil, 0x48218226ff3cd4bf},
		{[]byte{0}, 0x8e58975f6d0dc556},
		{[]byte("kvtier"), 0x29770f4d933a0a1f},
		{[]byte("kvtierfs-fp1-row"), 0xa3a8e1eebdd60e7d},
		{row, 0x54f641c2c37a70ab},
	} {
		if got := FingerprintHost(c.in); got != c.want {
			t.Errorf("FingerprintHost(%d bytes) = %#016x, want %#016x", len(c.in), got, c.want)
		}
	}
}

// TestFingerprintChunked checks that summing word-aligned chunks, as the
// fallback device path does, equals hashing the whole range.
func TestFingerprintChunked(t *testing.T) {
	p := make([]byte, 10_000+3)
	fillRandom(p, 2)
	for _, chunk := range []int{8, 24, 4096, 8192} {
		var sum uint64
		for done := 0; done < len(p); done += chunk {
			sum += fingerprintSum(p[done:min(done+chunk, len(p))], uint64(done/8))
		}
		if got, want := fingerprintFinish(sum, len(p)), FingerprintHost(p); got != want {
			t.Errorf("chunks of %d: %#016x, want %#016x", chunk, got, want)
		}
	}
}

// TestFingerprintSensitivity checks that the changes a wrong load makes
// (a flipped bit, swapped words or rows, a different length) change it.
func TestFingerprintSensitivity(t *testing.T) {
	p := make([]byte, 3*4096)
	fillRandom(p, 3)
	base := FingerprintHost(p)
	changed := func(what string, q []byte) {
		t.Helper()
		if FingerprintHost(q) == base {
			t.Errorf("%s did not change the fingerprint", what)
		}
	}
	for _, bit := range []int{0, 7, 8*8 + 3, len(p)*8 - 1, 5000*8 + 5} {
		q := append([]byte(nil), p...)
		q[bit/8] ^= 1 << (bit % 8)
		changed("flipping a bit", q)
	}
	q := append([]byte(nil), p...)
	w0, w1 := binary.LittleEndian.Uint64(q), binary.LittleEndian.Uint64(q[8:])
	binary.LittleEndian.PutUint64(q, w1)
	binary.LittleEndian.PutUint64(q[8:], w0)
	changed("swapping two words", q)
	q = append(append(append([]byte(nil), p[4096:8192]...), p[:4096]...), p[8192:]...)
	changed("swapping two rows", q)
	changed("a trailing zero byte", append(append([]byte(nil), p...), 0))
	changed("all zero bytes", make([]byte, len(p)))
}
