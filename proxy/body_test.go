package proxy

import (
	"encoding/json"
	"strings"
	"testing"
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

// FuzzScanBody checks the scanner against encoding/json: they agree on whether a body is a JSON
// object. The scanner checks neither UTF-8 nor nesting past maxJSONDepth the way encoding/json
// does, so such inputs are only required not to panic.
func FuzzScanBody(f *testing.F) {
	for _, seed := range []string{`{"model":"a","messages":[{"role":"user","content":"x"}]}`, `{"a":[1,2.5e-3,true,false,null,{"b":"\u0041"}]}`, `{"a":"\ud83d\ude00"}`, `{`, `{"a":01}`} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		_, err := scanBody(body)
		if !isUTF8(body) || deep(body) {
			return
		}
		var v map[string]json.RawMessage
		isObject := json.Unmarshal(body, &v) == nil && v != nil
		if isObject != (err == nil) {
			t.Fatalf("scanBody(%q) error = %v; encoding/json says object = %v", body, err, isObject)
		}
	})
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
