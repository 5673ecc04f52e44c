package block

import (
	"encoding/binary"
	"fmt"
	"testing"
)

// halfFilled is a row of size bytes whose first half holds deterministic
// non-zero words and whose second half is zero, as a row with one node's slot.
func halfFilled(size int) []byte {
	row := make([]byte, size)
	x := uint64(0x9E3779B97F4A7C15)
	for off := 0; off < size/2; off += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		binary.LittleEndian.PutUint64(row[off:], x|1)
	}
	return row
}

func TestDigestSamplesNonZeroWindows(t *testing.T) {
	const size = 64 << 10
	row := halfFilled(size)
	d := DigestOf(row)
	if d.Size != size || d.CRC != CRC32C(row) || len(d.Samples) != maxSamples {
		t.Fatalf("digest %+v", d)
	}
	for _, s := range d.Samples {
		if s.Value == 0 || int(s.Off) >= size/2 {
			t.Fatalf("sample %+v lies in the zero half or is zero", s)
		}
	}
	if !d.SamplesMatch(row) {
		t.Fatal("the digest's own row does not match its samples")
	}
	other := halfFilled(size)
	other[d.Samples[3].Off+1] ^= 1
	if d.SamplesMatch(other) || d.SamplesMatch(row[:size-PageSize]) {
		t.Fatal("a row differing at a sample, or of another size, matches the samples")
	}
	b := Binding{Tier: "m_0123456789ab_r0", Group: 1, Hash: "00112233445566778899aabbccddeeff"}
	rec, err := d.MarshalRecord(b)
	if err != nil {
		t.Fatal(err)
	}
	back, backBinding, bound, err := UnmarshalRecord(rec)
	if err != nil || !bound || backBinding != b || fmt.Sprint(back) != fmt.Sprint(d) {
		t.Fatalf("round trip: %v %+v %+v %v", err, back, backBinding, bound)
	}
}

func TestDigestOfSmallBlocks(t *testing.T) {
	for _, size := range []int{0, 7, 8, 9, 16} {
		row := make([]byte, size)
		for i := range row {
			row[i] = byte(i + 1)
		}
		d := DigestOf(row)
		if d.Size != int64(size) || d.CRC != CRC32C(row) {
			t.Errorf("%d bytes: digest %+v", size, d)
		}
		if size < 8 && len(d.Samples) != 0 || size >= 8 && len(d.Samples) == 0 {
			t.Errorf("%d bytes: %d samples", size, len(d.Samples))
		}
		for _, s := range d.Samples {
			if int64(s.Off)+8 > d.Size {
				t.Errorf("%d bytes: sample %+v past the end", size, s)
			}
		}
	}
}
