package ctlabi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
)

// The control file MOUNTPOINT/.kvtier/match: the engine writes one request
// and reads the answer back on the same descriptor.
//
// Request (at most MaxRequestBytes; unknown fields are rejected; tail and acc
// are left out or 0 for full attention):
//
//	{"tier":"DeepSeek_abc123def456_r0",
//	 "groups":[{"group":0,"kind":"full","keys":["ab12…",…]},
//	           {"group":1,"kind":"eagle","tail":4,"acc":16,"keys":[…]}]}
//
// Answer, per_group in the order of the request's groups:
//
//	{"hit_chunks":96,"per_group":[100,96],"probes":106}
//
// or, when the request is refused:
//
//	{"error":"match request: groups[1].acc: 2 is less than tail 4"}

type wireGroup struct {
	Group *int     `json:"group"`
	Kind  string   `json:"kind"`
	Tail  int      `json:"tail,omitempty"`
	Acc   int      `json:"acc,omitempty"`
	Keys  []string `json:"keys"`
}

type wireRequest struct {
	Tier   string      `json:"tier"`
	Groups []wireGroup `json:"groups"`
}

type errorAnswer struct {
	Error string `json:"error"`
}

type wireAnswer struct {
	HitChunks *int    `json:"hit_chunks"`
	PerGroup  []int   `json:"per_group"`
	Probes    int     `json:"probes"`
	Error     *string `json:"error"`
}

// DecodeMatchRequest parses and validates a request written to the control
// file. A request over MaxRequestBytes fails with ErrRequestTooLarge before
// it is parsed; an invalid one with a *RequestError naming the field.
func DecodeMatchRequest(b []byte) (MatchRequest, error) {
	if len(b) > MaxRequestBytes {
		return MatchRequest{}, fmt.Errorf("%w: %d bytes (limit %d)", ErrRequestTooLarge, len(b), MaxRequestBytes)
	}
	w, ok := decodeRequestFast(b)
	if !ok {
		var err error
		if w, err = decodeRequestJSON(b); err != nil {
			return MatchRequest{}, err
		}
	}
	req := MatchRequest{Tier: w.Tier, Groups: make([]GroupSpec, len(w.Groups))}
	for i, g := range w.Groups {
		field := "groups[" + strconv.Itoa(i) + "]"
		if g.Group == nil {
			return MatchRequest{}, &RequestError{field + ".group", "missing"}
		}
		kind, err := ParseGroupKind(g.Kind)
		if err != nil {
			return MatchRequest{}, &RequestError{field + ".kind", err.Error()}
		}
		req.Groups[i] = GroupSpec{Group: *g.Group, Kind: kind, Tail: g.Tail, Acc: g.Acc, Keys: g.Keys}
	}
	if err := req.Validate(); err != nil {
		return MatchRequest{}, err
	}
	return req, nil
}

// decodeRequestJSON decodes a request with encoding/json: any shape JSON
// allows, and precise errors.
func decodeRequestJSON(b []byte) (wireRequest, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var w wireRequest
	if err := dec.Decode(&w); err != nil {
		return w, fmt.Errorf("match request: malformed JSON: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return w, errors.New("match request: malformed JSON: data after the request object")
	}
	return w, nil
}

// EncodeMatchRequest validates req and returns its JSON request, as the
// engine writes it to the control file.
func EncodeMatchRequest(req MatchRequest) ([]byte, error) {
	if err := req.Validate(); err != nil {
		return nil, err
	}
	w := wireRequest{Tier: req.Tier, Groups: make([]wireGroup, len(req.Groups))}
	for i, g := range req.Groups {
		w.Groups[i] = wireGroup{Group: &g.Group, Kind: g.Kind.String(), Tail: g.Tail, Acc: g.Acc, Keys: g.Keys}
	}
	return json.Marshal(w)
}

// EncodeMatchResult returns the control file's answer: the result's JSON
// when err is nil, else {"error": err's text}.
func EncodeMatchResult(result MatchResult, err error) []byte {
	var answer any
	if err != nil {
		answer = errorAnswer{Error: err.Error()}
	} else {
		if result.PerGroup == nil {
			result.PerGroup = []int{}
		}
		answer = result
	}
	b, marshalErr := json.Marshal(answer)
	if marshalErr != nil { // ints and strings always marshal
		panic("ctlabi: encoding a match answer: " + marshalErr.Error())
	}
	return b
}

// DecodeMatchResult parses the control file's answer, as the engine reads
// it back. An {"error": …} answer is returned as an error with that text.
func DecodeMatchResult(b []byte) (MatchResult, error) {
	var a wireAnswer
	if err := json.Unmarshal(b, &a); err != nil {
		return MatchResult{}, fmt.Errorf("match answer: malformed JSON: %w", err)
	}
	if a.Error != nil {
		return MatchResult{}, errors.New(*a.Error)
	}
	if a.HitChunks == nil {
		return MatchResult{}, errors.New("match answer: missing hit_chunks")
	}
	return MatchResult{HitChunks: *a.HitChunks, PerGroup: a.PerGroup, Probes: a.Probes}, nil
}
