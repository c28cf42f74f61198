package configs

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseAdapters(t *testing.T) {
	const head = "run: vllm serve base --enable-lora --lora-modules $FERRY_LORA_MODULES\nservice:\n  ports: 8000\n  readiness_probe: /health\n  adapters:\n"
	tests := map[string]struct {
		yaml string
		want *Adapters
		env  map[string]string
	}{
		"at start": {
			yaml: head + "    max_loras: 4\n    modules:\n      sql: /adapters/sql\n      chat: org/chat-lora\n",
			want: &Adapters{Modules: map[string]string{"sql": "/adapters/sql", "chat": "org/chat-lora"}, MaxLoRAs: 4, Load: AdaptersAtStart, MaxLoaded: 8},
			env:  map[string]string{EnvLoRAModules: "chat=org/chat-lora sql=/adapters/sql", EnvMaxLoRAs: "4"},
		},
		"on demand": {
			yaml: head + "    load: on_demand\n    max_loaded: 3\n    modules: {a: /a}\n",
			want: &Adapters{Modules: map[string]string{"a": "/a"}, MaxLoRAs: 1, Load: AdaptersOnDemand, MaxLoaded: 3},
			env:  map[string]string{EnvLoRAModules: "", EnvMaxLoRAs: "1", EnvRuntimeLoRA: "True"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			task, err := Parse("task.yaml", []byte(tc.yaml), Overrides{})
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, task.Service.Adapters); diff != "" {
				t.Errorf("adapters (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.env, task.Service.Adapters.Env()); diff != "" {
				t.Errorf("env (-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseAdaptersErrors(t *testing.T) {
	const head = "run: serve\nservice:\n  ports: 8000\n  readiness_probe: /health\n  adapters:\n"
	tests := map[string]struct{ yaml, want string }{
		"no modules":          {head + "    max_loras: 2\n", "task.yaml:6:5: service.adapters.modules: is required"},
		"bad name":            {head + "    modules: {\"a b\": /x}\n", "service.adapters.modules.a b: an adapter's name"},
		"path with a space":   {head + "    modules: {a: \"/x y\"}\n", "service.adapters.modules.a: a path without spaces"},
		"max_loaded at start": {head + "    max_loaded: 4\n    modules: {a: /a}\n", "service.adapters.max_loaded: goes with load: on_demand"},
		"max_loaded below":    {head + "    load: on_demand\n    max_loras: 4\n    max_loaded: 2\n    modules: {a: /a}\n", "service.adapters.max_loaded"},
		"unknown load":        {head + "    load: lazy\n    modules: {a: /a}\n", "service.adapters.load: unknown mode \"lazy\""},
		"unknown key":         {head + "    max_lora: 4\n    modules: {a: /a}\n", "unknown field \"max_lora\""},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := Parse("task.yaml", []byte(tc.yaml), Overrides{})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Parse error %v, want it to contain %q", err, tc.want)
			}
		})
	}
}
