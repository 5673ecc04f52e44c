package ctlabi

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
)

func testKey(chunk int) string { return fmt.Sprintf("%064x", chunk+1) }

func TestGroupKindNames(t *testing.T) {
	for _, kind := range []GroupKind{KindFull, KindSliding, KindEagle} {
		parsed, err := ParseGroupKind(kind.String())
		if err != nil || parsed != kind {
			t.Errorf("ParseGroupKind(%q) = %v, %v; want %v", kind.String(), parsed, err, kind)
		}
	}
	if got := []string{KindFull.String(), KindSliding.String(), KindEagle.String()}; !slices.Equal(got, []string{"full", "sliding", "eagle"}) {
		t.Errorf("names = %v", got)
	}
	if _, err := ParseGroupKind("Full"); err == nil {
		t.Error(`ParseGroupKind("Full") succeeded, want an error`)
	}
	if got := GroupKind(7).String(); got != "GroupKind(7)" {
		t.Errorf("GroupKind(7).String() = %q", got)
	}
}

func TestMatchRequestJSON(t *testing.T) {
	key0, key1 := testKey(0), testKey(1)
	body := `{"tier":"DeepSeek_abc123def456_r0","groups":[` +
		`{"group":0,"kind":"full","keys":["` + key0 + `","` + key1 + `"]},` +
		`{"group":1,"kind":"eagle","tail":4,"acc":16,"keys":["` + key0 + `","` + key1 + `"]}]}`
	want := MatchRequest{Tier: "DeepSeek_abc123def456_r0", Groups: []GroupSpec{
		{Group: 0, Kind: KindFull, Keys: []string{key0, key1}},
		{Group: 1, Kind: KindEagle, Tail: 4, Acc: 16, Keys: []string{key0, key1}},
	}}
	got, err := DecodeMatchRequest([]byte(body))
	if err != nil {
		t.Fatalf("DecodeMatchRequest: %v", err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("decoded %+v, want %+v", got, want)
	}
	encoded, err := EncodeMatchRequest(want)
	if err != nil {
		t.Fatalf("EncodeMatchRequest: %v", err)
	}
	if string(encoded) != body {
		t.Errorf("encoded\n%s\nwant\n%s", encoded, body)
	}
	again, err := DecodeMatchRequest(encoded)
	if err != nil || !reflect.DeepEqual(again, want) {
		t.Errorf("round trip = %+v, %v", again, err)
	}
	if _, err := EncodeMatchRequest(MatchRequest{Tier: "t"}); err == nil {
		t.Error("EncodeMatchRequest accepted a request without groups")
	}
}

func TestDecodeMatchRequestMalformed(t *testing.T) {
	key := testKey(0)
	group := func(fields string) string {
		return `{"tier":"t","groups":[{` + fields + `}]}`
	}
	tests := []struct {
		name      string
		body      string
		wantField string // for a *RequestError; "" for a JSON error
	}{
		{"empty", ``, ""},
		{"truncated", `{"tier":"t","groups":[`, ""},
		{"not an object", `[1,2]`, ""},
		{"null", `null`, "tier"},
		{"trailing data", group(`"group":0,"kind":"full","keys":["`+key+`"]`) + ` {}`, ""},
		{"unknown field", group(`"group":0,"kind":"sliding","tails":4,"acc":4,"keys":["` + key + `"]`), ""},
		{"tail as a string", group(`"group":0,"kind":"sliding","tail":"4","acc":4,"keys":["` + key + `"]`), ""},
		{"key as a number", group(`"group":0,"kind":"full","keys":[12345]`), ""},
		{"missing group", group(`"kind":"full","keys":["` + key + `"]`), "groups[0].group"},
		{"unknown kind", group(`"group":0,"kind":"window","keys":["` + key + `"]`), "groups[0].kind"},
		{"missing kind", group(`"group":0,"keys":["` + key + `"]`), "groups[0].kind"},
		{"eagle without tail", group(`"group":0,"kind":"eagle","acc":16,"keys":["` + key + `"]`), "groups[0].tail"},
		{"no groups", `{"tier":"t","groups":[]}`, "groups"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := DecodeMatchRequest([]byte(tt.body))
			if err == nil {
				t.Fatal("DecodeMatchRequest succeeded, want an error")
			}
			var reqErr *RequestError
			isReqErr := errors.As(err, &reqErr)
			switch {
			case tt.wantField == "" && isReqErr:
				t.Errorf("error = %v, want a JSON error", err)
			case tt.wantField == "" && !strings.Contains(err.Error(), "malformed JSON"):
				t.Errorf("error %q does not say malformed JSON", err)
			case tt.wantField != "" && (!isReqErr || reqErr.Field != tt.wantField):
				t.Errorf("error = %v, want a *RequestError on %q", err, tt.wantField)
			}
		})
	}
}

func TestDecodeMatchRequestTooLarge(t *testing.T) {
	body := bytes.Repeat([]byte(" "), MaxRequestBytes+1)
	if _, err := DecodeMatchRequest(body); !errors.Is(err, ErrRequestTooLarge) {
		t.Errorf("error = %v, want ErrRequestTooLarge", err)
	}
}
