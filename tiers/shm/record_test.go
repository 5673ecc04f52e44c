package shm

import (
	"bytes"
	"encoding/hex"
	"testing"
)

// goldenDigest is the digest behind the golden records below.
var goldenDigest = Digest{Size: 8192, CRC: 0xdeadbeef, Samples: []Sample{{Off: 16, Value: 0x0102030405060708}, {Off: 8184, Value: 0xff}}}

var goldenKey = Key{Group: 3, Hash: "0123456789abcdef"}

// The records as shipped: v1 by every release before records were bound to
// their block, v2 since. Stores hold both; both must keep decoding.
const (
	goldenV1 = "0000000000002000" + "deadbeef" + "02" +
		"00000010" + "0102030405060708" +
		"00001ff8" + "00000000000000ff"
	goldenV2 = "02" + "0000000000000003" + "10" + "30313233343536373839616263646566" + goldenV1
)

func TestRecordGoldenV1(t *testing.T) {
	b, _ := hex.DecodeString(goldenV1)
	d, key, bound, err := UnmarshalRecord(b)
	if err != nil || bound || key != (Key{}) {
		t.Fatalf("v1 record: %v, key %+v, bound %v", err, key, bound)
	}
	if !equalDigest(d, goldenDigest) {
		t.Fatalf("v1 record decoded to %+v, want %+v", d, goldenDigest)
	}
}

func TestRecordGoldenV2(t *testing.T) {
	b, err := goldenDigest.MarshalRecord(goldenKey)
	if err != nil {
		t.Fatal(err)
	}
	if got := hex.EncodeToString(b); got != goldenV2 {
		t.Fatalf("v2 encoding changed:\ngot  %s\nwant %s", got, goldenV2)
	}
	d, key, bound, err := UnmarshalRecord(b)
	if err != nil || !bound || key != goldenKey || !equalDigest(d, goldenDigest) {
		t.Fatalf("v2 record: %v, %+v, key %+v, bound %v", err, d, key, bound)
	}
}

func TestRecordRejectsMalformed(t *testing.T) {
	v1, _ := hex.DecodeString(goldenV1)
	v2, _ := hex.DecodeString(goldenV2)
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
	}
	for name, b := range bad {
		if _, _, _, err := UnmarshalRecord(b); err == nil {
			t.Errorf("%s: record %x accepted", name, b)
		}
	}
	if _, err := goldenDigest.MarshalRecord(Key{}); err == nil {
		t.Error("record bound to an empty hash encoded")
	}
}

func equalDigest(a, b Digest) bool {
	if a.Size != b.Size || a.CRC != b.CRC || len(a.Samples) != len(b.Samples) {
		return false
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
	for _, h := range []string{goldenV1, goldenV2} {
		b, _ := hex.DecodeString(h)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		d, key, bound, err := UnmarshalRecord(b)
		if err != nil {
			return
		}
		var again []byte
		if bound {
			if again, err = d.MarshalRecord(key); err != nil {
				t.Fatalf("decoded record %x does not encode: %v", b, err)
			}
		} else {
			again = d.appendV1(nil)
		}
		if !bytes.Equal(again, b) {
			t.Fatalf("record %x decodes to %+v %+v, which encodes to %x", b, d, key, again)
		}
		if len(b) > MaxRecordBytes {
			t.Fatalf("accepted a record of %d bytes, more than MaxRecordBytes %d", len(b), MaxRecordBytes)
		}
	})
}
