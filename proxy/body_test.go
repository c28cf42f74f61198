package proxy

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/ferryserve/ferry/policy"
)

func TestScanBody(t *testing.T) {
	tests := map[string]struct {
		body       string
		wantModel  string
		wantPrompt string
		wantErr    error
	}{
		"chat": {
			body:       `{"model":"llama","messages":[{"role":"user","content":"hi \"there\""}],"stream":true}`,
			wantModel:  "llama",
			wantPrompt: `[{"role":"user","content":"hi \"there\""}]`,
		},
		"completion with spaces": {
			body:       " {\n \"prompt\" : \"once upon\" , \"model\" : \"m\\u00e9\", \"max_tokens\": -1.5e+3 } ",
			wantModel:  `m\u00e9`,
			wantPrompt: `"once upon"`,
		},
		"nested model key is not the model": {
			body:       `{"metadata":{"model":"x"},"n":[1,[2,{"model":"y"}]],"prompt":null}`,
			wantPrompt: `null`,
		},
		"empty object":        {body: `{}`},
		"non-string model":    {body: `{"model":7}`},
		"array":               {body: `[1]`, wantErr: errBodyNotObject},
		"empty":               {body: ``, wantErr: errBodyNotObject},
		"truncated":           {body: `{"model":"llama","messages":[`, wantErr: errBodySyntax},
		"trailing garbage":    {body: `{"model":"a"} x`, wantErr: errBodySyntax},
		"trailing comma":      {body: `{"model":"a",}`, wantErr: errBodySyntax},
		"bad escape":          {body: `{"model":"\x"}`, wantErr: errBodySyntax},
		"control char":        {body: "{\"model\":\"a\tb\"}", wantErr: errBodySyntax},
		"leading zero":        {body: `{"n":01}`, wantErr: errBodySyntax},
		"bare minus":          {body: `{"n":-}`, wantErr: errBodySyntax},
		"unquoted key":        {body: `{model:"a"}`, wantErr: errBodySyntax},
		"too deep":            {body: `{"a":` + strings.Repeat("[", 200) + strings.Repeat("]", 200) + `}`, wantErr: errBodySyntax},
		"single quotes":       {body: `{'model':'a'}`, wantErr: errBodySyntax},
		"literal misspelled":  {body: `{"a":tru}`, wantErr: errBodySyntax},
		"missing colon":       {body: `{"a" 1}`, wantErr: errBodySyntax},
		"exponent no digits":  {body: `{"a":1e}`, wantErr: errBodySyntax},
		"fraction no digits":  {body: `{"a":1.}`, wantErr: errBodySyntax},
		"unterminated string": {body: `{"a":"b`, wantErr: errBodySyntax},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := scanBody([]byte(tt.body))
			if err != tt.wantErr {
				t.Fatalf("scanBody(%q) error = %v, want %v", tt.body, err, tt.wantErr)
			}
			if err == nil && string(got.Model) != tt.wantModel || string(got.Prompt) != tt.wantPrompt {
				t.Errorf("scanBody(%q) = model %q prompt %q, want %q %q", tt.body, got.Model, got.Prompt, tt.wantModel, tt.wantPrompt)
			}
		})
	}
}

// TestScanBodyStream: a request counts as streamed unless its last "stream" surely reads as
// false to a lax decoder (pydantic, serde), and an escaped key is still the key.
func TestScanBodyStream(t *testing.T) {
	tests := map[string]bool{
		`{"stream":true}`:                    true,
		`{"model":"m","stream": true }`:      true,
		`{"stream":1}`:                       true,
		`{"stream":1.0}`:                     true,
		`{"stream":"true"}`:                  true,
		`{"stream":"YES"}`:                   true,
		`{"stream":{}}`:                      true,
		`{"stream":"f\u0061lse"}`:            true, // escaped: counted, to be safe
		`{"str\u0065am":true}`:               true,
		`{"str\u0065\u0061m":true}`:          true,
		`{"stream":false,"stream":true}`:     true,
		`{}`:                                 false,
		`{"stream":false}`:                   false,
		`{"stream":null}`:                    false,
		`{"stream":0}`:                       false,
		`{"stream":-0.0e5}`:                  false,
		`{"stream":"False"}`:                 false,
		`{"stream":"off"}`:                   false,
		`{"stream":"n"}`:                     false,
		`{"stream":true,"stream":false}`:     false,
		`{"streams":true}`:                   false,
		`{"Stream":true}`:                    false,
		`{"str\u00e9am":true}`:               false,
		`{"options":{"stream":true}}`:        false,
		`{"stream_options":{"stream":true}}`: false,
	}
	for body, want := range tests {
		f, err := scanBody([]byte(body))
		if err != nil {
			t.Errorf("scanBody(%s): %v", body, err)
			continue
		}
		if f.Stream != want {
			t.Errorf("scanBody(%s).Stream = %v, want %v", body, f.Stream, want)
		}
	}
}

// FuzzScanBody checks the scanner against encoding/json: they agree on whether a body is a JSON
// object and, for objects, on whether it asks to stream (see streamRequested; encoding/json
// unescapes keys and keeps the last of duplicates, as replicas do). The scanner checks neither
// UTF-8 nor nesting past maxJSONDepth the way encoding/json does, so such inputs are only
// required not to panic. Seeds: testdata/fuzz/FuzzScanBody and the f.Add calls.
func FuzzScanBody(f *testing.F) {
	for _, seed := range []string{`{"model":"a","messages":[{"role":"user","content":"x"}]}`, `{"a":[1,2.5e-3,true,false,null,{"b":"\u0041"}]}`, `{"a":"\ud83d\ude00"}`, `{`, `{"a":01}`} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		fields, err := scanBody(body)
		if !isUTF8(body) || deep(body) {
			return
		}
		var v map[string]json.RawMessage
		isObject := json.Unmarshal(body, &v) == nil && v != nil
		if isObject != (err == nil) {
			t.Fatalf("scanBody(%q) error = %v; encoding/json says object = %v", body, err, isObject)
		}
		if !isObject {
			return
		}
		raw, present := v["stream"]
		if want := present && referenceStream(raw); fields.Stream != want {
			t.Fatalf("scanBody(%q).Stream = %v, want %v", body, fields.Stream, want)
		}
	})
}

// referenceStream is streamRequested written over encoding/json's decoding.
func referenceStream(raw json.RawMessage) bool {
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return true
	}
	switch x := v.(type) {
	case nil:
		return false
	case bool:
		return x
	case float64:
		return x != 0
	case string:
		if strings.Contains(string(raw), `\`) {
			return true
		}
		switch strings.ToLower(x) {
		case "false", "0", "no", "off", "f", "n":
			return false
		}
	}
	return true
}

func isUTF8(b []byte) bool { return strings.ToValidUTF8(string(b), "\uFFFD") == string(b) }

func deep(b []byte) bool {
	return strings.Count(string(b), "[")+strings.Count(string(b), "{") > maxJSONDepth
}

func BenchmarkScanBody(b *testing.B) {
	body := []byte(`{"model":"meta-llama/Llama-3.1-8B-Instruct","messages":[{"role":"system","content":"` +
		strings.Repeat("You are a helpful assistant. ", 40) + `"},{"role":"user","content":"Tell me a story about a ferry."}],"stream":true,"max_tokens":256,"temperature":0.7}`)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := scanBody(body); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkScanAndPick is what routing costs a 4k-token chat request before it is sent: the
// body scanned for its model and messages, and least_ttft's pick among 4 replicas whose index
// holds the conversation's earlier turns (issue 39's target: 5 µs).
func BenchmarkScanAndPick(b *testing.B) {
	var sb strings.Builder
	sb.WriteString(`{"model":"meta-llama/Llama-3.1-8B-Instruct","stream":true,"max_tokens":256,"messages":[{"role":"system","content":"`)
	sb.WriteString(strings.Repeat("You are a helpful assistant; answer briefly. ", 45))
	sb.WriteString(`"}`)
	for turn := range 4 {
		fmt.Fprintf(&sb, `,{"role":"user","content":"%s"},{"role":"assistant","content":"%s"}`,
			strings.Repeat(fmt.Sprintf("turn %d asks about ferries. ", turn), 70), strings.Repeat("An answer. ", 160))
	}
	sb.WriteString(`]}`)
	body := []byte(sb.String())
	picker, err := policy.New(policy.LeastTTFT, policy.Options{})
	if err != nil {
		b.Fatal(err)
	}
	replicas := make([]*policy.Replica, 4)
	for i := range replicas {
		replicas[i] = &policy.Replica{ID: i + 1, Addr: fmt.Sprintf("10.0.0.%d:8000", i+1)}
	}
	picker.(policy.Preparer).Prepare(replicas)
	var req policy.Request
	pick := func() {
		f, err := scanBody(body)
		if err != nil {
			b.Fatal(err)
		}
		req.Reset()
		req.Prompt, req.Model = f.Prompt, f.Model
		if picker.Pick(&req, replicas) == nil {
			b.Fatal("no pick")
		}
	}
	pick() // the index now holds the conversation
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		pick()
	}
}

// TestScanBodyLongStrings puts a control character, an escape or the closing quote at every
// offset around the word boundaries skipPlain reads at, and checks scanBody against
// encoding/json each time.
func TestScanBodyLongStrings(t *testing.T) {
	for n := range 80 {
		plain := strings.Repeat("abcdefgh", 10)[:n]
		for _, tail := range []string{"", "\x01", "\x1f", `\n`, `\"`, `\u00e9`, `\x`, "é", "\x7f"} {
			for _, after := range []string{"", "zz", strings.Repeat("y", 40)} {
				body := []byte(`{"model":"m","messages":[{"role":"user","content":"` + plain + tail + after + `"}]}`)
				_, err := scanBody(body)
				var v map[string]json.RawMessage
				if valid := json.Unmarshal(body, &v) == nil; valid != (err == nil) {
					t.Fatalf("scanBody(%q): error %v, encoding/json says valid %v", body, err, valid)
				}
			}
		}
	}
}
