package ctlabi

import (
	"reflect"
	"testing"
)

// fastCases are request bodies the fast decoder must either decode exactly
// as encoding/json does or hand over to it.
var fastCases = []string{
	`{"tier":"t","groups":[{"group":0,"kind":"full","keys":["00ab","cd"]}]}`,
	" \n{ \"tier\" : \"t\" ,\t\"groups\" : [ { \"group\" : 1 , \"kind\" : \"eagle\" , \"tail\" : 4 , \"acc\" : 16 , \"keys\" : [ \"aa\" , \"bb\" ] } , {\"group\":2,\"kind\":\"sliding\",\"tail\":1,\"acc\":1,\"keys\":[]} ] } \r\n",
	`{"groups":[{"keys":["ab"],"kind":"full","group":-0}],"tier":"x"}`,
	`{}`,
	`{"tier":"t","groups":[]}`,
	`{"tier":"t","groups":[{}]}`,
	`{"tier":"t","groups":[{"group":0,"kind":"full","keys":["a\"b"]}]}`,              // escape
	`{"tier":"t\u0041","groups":[]}`,                                                 // escape
	`{"Tier":"t","groups":[]}`,                                                       // field names match case-insensitively
	`{"tier":"t","tier":"u","groups":[]}`,                                            // repeated field
	`{"tier":"t","groups":[{"group":0,"group":1,"kind":"full","keys":["ab"]}]}`,      // repeated field
	`{"tier":null,"groups":[]}`,                                                      // null
	`{"tier":"t","groups":[{"group":null,"kind":"full","keys":["ab"]}]}`,             // null
	`{"tier":"t","groups":[null]}`,                                                   // null group
	`{"tier":"t","groups":[{"group":1.0,"kind":"full","keys":["ab"]}]}`,              // fraction
	`{"tier":"t","groups":[{"group":1e2,"kind":"full","keys":["ab"]}]}`,              // exponent
	`{"tier":"t","groups":[{"group":01,"kind":"full","keys":["ab"]}]}`,               // leading zero
	`{"tier":"t","groups":[{"group":99999999999999999999,"kind":"full","keys":[]}]}`, // overflow
	`{"tier":"t","groups":[{"group":-,"kind":"full","keys":[]}]}`,
	"{\"tier\":\"t\x01\",\"groups\":[]}",   // control byte
	"{\"tier\":\"t\xff\",\"groups\":[]}",   // invalid UTF-8
	"{\"tier\":\"t\u00e9\",\"groups\":[]}", // valid UTF-8
	`{"tier":"t","groups":[]} {}`,          // trailing data
	`{"tier":"t","groups":[],}`,            // trailing comma
	`{"tier":"t","groups":[{"group":0,"kind":"full","keys":["ab",]}]}`,
	`{"tier":"t","groups":[{"group":0,"kind":"full","keys":["ab"]}]`, // truncated
	`{"tier":"t","groups":[{"group":0,"kind":"full","keys":[12]}]}`,
	`{"tier":"t","extra":1,"groups":[]}`,
	`[]`,
	``,
}

// checkFastAgrees decodes body both ways: when the fast decoder accepts,
// encoding/json must accept too and give the same request.
func checkFastAgrees(t *testing.T, body []byte) {
	fast, ok := decodeRequestFast(body)
	if !ok {
		return
	}
	slow, err := decodeRequestJSON(body)
	if err != nil {
		t.Fatalf("%q: the fast decoder accepted what encoding/json refuses: %v", body, err)
	}
	if !reflect.DeepEqual(fast, slow) {
		t.Fatalf("%q: fast decoder %+v, encoding/json %+v", body, fast, slow)
	}
}

// TestDecodeRequestFastAgreesWithJSON checks the fast decoder on requests
// of every shape it must take or hand over, and that it does take the
// engine's own requests.
func TestDecodeRequestFastAgreesWithJSON(t *testing.T) {
	for _, body := range fastCases {
		checkFastAgrees(t, []byte(body))
	}
	req := MatchRequest{Tier: "Model_0123456789ab_r0", Groups: []GroupSpec{
		{Group: 0, Kind: KindFull, Keys: []string{testKey(1), testKey(2)}},
		{Group: 1, Kind: KindEagle, Tail: 4, Acc: 16, Keys: []string{testKey(3), testKey(4)}},
	}}
	body, err := EncodeMatchRequest(req)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := decodeRequestFast(body); !ok {
		t.Fatalf("the fast decoder handed over the engine's own request %s", body)
	}
	got, err := DecodeMatchRequest(body)
	if err != nil || !reflect.DeepEqual(got, req) {
		t.Fatalf("DecodeMatchRequest = %+v, %v, want %+v", got, err, req)
	}
}

// FuzzDecodeRequestFast feeds arbitrary bodies to both decoders.
func FuzzDecodeRequestFast(f *testing.F) {
	for _, body := range fastCases {
		f.Add([]byte(body))
	}
	f.Fuzz(checkFastAgrees)
}
