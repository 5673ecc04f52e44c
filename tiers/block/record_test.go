package block

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"testing"
)

// goldenDigest is the digest behind the golden records below.
var goldenDigest = Digest{Size: 8192, CRC: 0xdeadbeef, Samples: []Sample{{Off: 16, Value: 0x0102030405060708}, {Off: 8184, Value: 0xff}}}

var goldenBinding = Binding{Tier: "m_0123456789ab_r1", Group: 3, Hash: "0123456789abcdef"}

// Every record format shipped, as its writer laid it out (git history of
// tiers/disk/checksum.go and tiers/shm/digest.go): v0 by the first release
// (e93459c, crc then size), v1 from a82d37c until records were bound to their
// block, v2 from 3542a0e until records were bound to their tier, v3 since.
// Stores may hold all four.
const (
	goldenV0 = "deadbeef" + "0000000000002000"
	goldenV1 = "0000000000002000" + "deadbeef" + "02" +
		"00000010" + "0102030405060708" +
		"00001ff8" + "00000000000000ff"
	goldenV2 = "02" + "0000000000000003" + "10" + "30313233343536373839616263646566" + goldenV1
	// goldenV3's one chunk CRC is the block's CRC (8192 bytes, one chunk).
	goldenV3 = "03" + "0000000000000003" + "10" + "30313233343536373839616263646566" +
		"11" + "6d5f303132333435363738396162" + "5f7231" + goldenV1 + "0001" + "deadbeef"
)

// goldenChunked is goldenDigest with its chunk CRC.
var goldenChunked = Digest{Size: goldenDigest.Size, CRC: goldenDigest.CRC, Chunks: []uint32{0xdeadbeef}, Samples: goldenDigest.Samples}

// marshalV2 is the v2 encoding, which only earlier releases wrote.
func marshalV2(d Digest, b Binding) []byte {
	rec := []byte{recordV2}
	rec = binary.BigEndian.AppendUint64(rec, b.Group)
	rec = append(rec, byte(len(b.Hash)))
	rec = append(rec, b.Hash...)
	return d.appendV1(rec)
}

func TestRecordGoldenV0Refused(t *testing.T) {
	// A v0 record carries no samples: the block cannot be found in a row by
	// it, so it is refused and the block left unproven (DESIGN "The store").
	for _, size := range []string{"0000000000002000", "0000000000200000", "0000000000833400"} {
		b, _ := hex.DecodeString("deadbeef" + size)
		if d, _, _, err := UnmarshalRecord(b); err == nil {
			t.Errorf("v0 record %x decoded to %+v", b, d)
		}
	}
	b, _ := hex.DecodeString(goldenV0)
	if _, _, _, err := UnmarshalRecord(b); err == nil {
		t.Errorf("v0 record %s accepted", goldenV0)
	}
}

func TestRecordGoldenV1(t *testing.T) {
	b, _ := hex.DecodeString(goldenV1)
	d, binding, bound, err := UnmarshalRecord(b)
	if err != nil || bound || binding != (Binding{}) {
		t.Fatalf("v1 record: %v, binding %+v, bound %v", err, binding, bound)
	}
	if !equalDigest(d, goldenDigest) {
		t.Fatalf("v1 record decoded to %+v, want %+v", d, goldenDigest)
	}
	if got := hex.EncodeToString(goldenDigest.appendV1(nil)); got != goldenV1 {
		t.Fatalf("v1 body encoding changed:\ngot  %s\nwant %s", got, goldenV1)
	}
}

func TestRecordGoldenV2(t *testing.T) {
	// A v2 record names its block's group and hash but no tier.
	b, _ := hex.DecodeString(goldenV2)
	d, binding, bound, err := UnmarshalRecord(b)
	if err != nil || !bound || binding != (Binding{Group: 3, Hash: "0123456789abcdef"}) || !equalDigest(d, goldenDigest) {
		t.Fatalf("v2 record: %v, %+v, binding %+v, bound %v", err, d, binding, bound)
	}
	if got := hex.EncodeToString(marshalV2(goldenDigest, goldenBinding)); got != goldenV2 {
		t.Fatalf("v2 encoding changed:\ngot  %s\nwant %s", got, goldenV2)
	}
	if !binding.Fits(Name{Tier: "any_tier", Group: 3, Hash: "0123456789abcdef"}) {
		t.Error("a v2 record does not fit its block under any tier")
	}
}

func TestRecordGoldenV3(t *testing.T) {
	b, err := goldenChunked.MarshalRecord(goldenBinding)
	if err != nil {
		t.Fatal(err)
	}
	if got := hex.EncodeToString(b); got != goldenV3 {
		t.Fatalf("v3 encoding changed:\ngot  %s\nwant %s", got, goldenV3)
	}
	d, binding, bound, err := UnmarshalRecord(b)
	if err != nil || !bound || binding != goldenBinding || !equalDigest(d, goldenChunked) {
		t.Fatalf("v3 record: %v, %+v, binding %+v, bound %v", err, d, binding, bound)
	}
	name := Name{Tier: "m_0123456789ab_r1", Group: 3, Hash: "0123456789abcdef"}
	if name.Binding() != goldenBinding || !binding.Fits(name) {
		t.Fatalf("%+v binds its record to %+v, want %+v", name, name.Binding(), goldenBinding)
	}
	// The same block under another rank's tier: refused.
	for _, other := range []Name{
		{Tier: "m_0123456789ab_r0", Group: 3, Hash: "0123456789abcdef"},
		{Tier: name.Tier, Group: 4, Hash: name.Hash},
		{Tier: name.Tier, Group: 3, Hash: "0123456789abcdee"},
	} {
		if binding.Fits(other) {
			t.Errorf("a record bound to %+v fits %+v", binding, other)
		}
	}
}

func TestRecordRejectsMalformed(t *testing.T) {
	v1, _ := hex.DecodeString(goldenV1)
	v2, _ := hex.DecodeString(goldenV2)
	v3, _ := hex.DecodeString(goldenV3)
	bad := map[string][]byte{
		"empty":             nil,
		"v1 truncated":      v1[:len(v1)-1],
		"v1 extra byte":     append(append([]byte{}, v1...), 0),
		"v1 too many":       func() []byte { c := bytes.Clone(v1); c[12] = 9; return c }(),
		"v1 sample outside": func() []byte { c := bytes.Clone(v1); c[len(c)-9] = 0xff; return c }(),
		"v1 huge size":      func() []byte { c := bytes.Clone(v1); c[0] = 0x01; return c }(),
		"v2 no hash":        func() []byte { c := bytes.Clone(v2[:10]); c[9] = 0; return append(c, v1...) }(),
		"v2 hash past end":  func() []byte { c := bytes.Clone(v2); c[9] = 200; return c }(),
		"v2 key only":       v2[:10+16],
		"v2 short":          v2[:5],
		"v3 no tier":        func() []byte { c := bytes.Clone(v3); c[26] = 0; return c }(),
		"v3 chunk count":    func() []byte { c := bytes.Clone(v3); c[len(c)-5] = 2; return c }(),
		"v3 chunk crc":      func() []byte { c := bytes.Clone(v3); c[len(c)-1] ^= 1; return c }(),
		"v3 truncated":      v3[:len(v3)-1],
		"v3 extra byte":     append(bytes.Clone(v3), 0),
	}
	for name, b := range bad {
		if _, _, _, err := UnmarshalRecord(b); err == nil {
			t.Errorf("%s: record %x accepted", name, b)
		}
	}
	if _, err := goldenDigest.MarshalRecord(Binding{Tier: "t"}); err == nil {
		t.Error("record bound to an empty hash encoded")
	}
	if _, err := goldenDigest.MarshalRecord(Binding{Hash: "ab"}); err == nil {
		t.Error("record bound to an empty tier encoded")
	}
	if _, err := (Digest{Size: 8192, CRC: 1, Chunks: []uint32{2}}).MarshalRecord(goldenBinding); err == nil {
		t.Error("record whose chunk CRCs disagree with its CRC encoded")
	}
	tooMany := Digest{Size: 1 << 20, Samples: make([]Sample, maxSamples+1)}
	if _, err := tooMany.MarshalRecord(goldenBinding); err == nil {
		t.Error("record with more samples than a digest keeps encoded")
	}
}

func TestParseVLLMChecksum(t *testing.T) {
	// vLLM's io.py: crc32c(data).to_bytes(4, "big"), so 0xdeadbeef is de ad be ef.
	if got, err := ParseVLLMChecksum([]byte{0xde, 0xad, 0xbe, 0xef}); err != nil || got != 0xdeadbeef {
		t.Errorf("ParseVLLMChecksum(de ad be ef) = %08x, %v; want deadbeef", got, err)
	}
	// CRC32C("123456789") is e3069283, the standard check value.
	if got, err := ParseVLLMChecksum([]byte{0xe3, 0x06, 0x92, 0x83}); err != nil || got != CRC32C([]byte("123456789")) {
		t.Errorf("ParseVLLMChecksum(e3 06 92 83) = %08x, %v; want the CRC32C of 123456789", got, err)
	}
	// vLLM's loader refuses any other length, so do we: text and
	// little-endian guesses of earlier releases included.
	for _, in := range []string{"", "3735928559", "deadbeef", "\xef\xbe\xad", "\xde\xad\xbe\xef\x00"} {
		if got, err := ParseVLLMChecksum([]byte(in)); err == nil {
			t.Errorf("ParseVLLMChecksum(%q) = %08x, accepted", in, got)
		}
	}
}

func equalDigest(a, b Digest) bool {
	if a.Size != b.Size || a.CRC != b.CRC || len(a.Samples) != len(b.Samples) || len(a.Chunks) != len(b.Chunks) {
		return false
	}
	for i := range a.Chunks {
		if a.Chunks[i] != b.Chunks[i] {
			return false
		}
	}
	for i := range a.Samples {
		if a.Samples[i] != b.Samples[i] {
			return false
		}
	}
	return true
}

// FuzzUnmarshalRecord checks that any xattr value either is refused or
// decodes to a record that encodes back to exactly the same bytes.
func FuzzUnmarshalRecord(f *testing.F) {
	for _, h := range []string{goldenV0, goldenV1, goldenV2, goldenV3} {
		b, _ := hex.DecodeString(h)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		d, binding, bound, err := UnmarshalRecord(b)
		if err != nil {
			return
		}
		var again []byte
		switch {
		case bound && binding.Tier == "":
			again = marshalV2(d, binding)
		case bound:
			if again, err = d.MarshalRecord(binding); err != nil {
				t.Fatalf("decoded record %x does not encode: %v", b, err)
			}
		default:
			again = d.appendV1(nil)
		}
		if !bytes.Equal(again, b) {
			t.Fatalf("record %x decodes to %+v %+v, which encodes to %x", b, d, binding, again)
		}
		if len(b) > MaxRecordBytes {
			t.Fatalf("accepted a record of %d bytes, more than MaxRecordBytes %d", len(b), MaxRecordBytes)
		}
	})
}
