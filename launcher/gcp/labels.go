package gcp

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// GCP label keys and values may hold only lowercase letters, digits, '_' and '-' (keys start
// with a letter; both at most 63 characters), while Ferry's keys are dotted ("ferry.service")
// and values are free text. The mapping is reversible, so List returns the labels Launch was
// given and a restarted controller adopts its VMs:
//
//   - a key's "ferry." prefix becomes "ferry-": ferry.service → ferry-service,
//     ferry.replica-id → ferry-replica-id, so the console and `gcloud --filter` read naturally;
//   - every other byte outside [a-z0-9-] is written "_xx" with its hex code, '_' included:
//     "Chat.v2" → "_43hat_2ev2". A key that itself begins "ferry-" escapes that dash
//     ("ferry_2d…") so it cannot be mistaken for a "ferry." key.
//
// Values use the same escaping without the prefix rule.

const (
	ferryDot  = "ferry."
	ferryDash = "ferry-"
)

func encodeLabelKey(k string) string {
	switch {
	case strings.HasPrefix(k, ferryDot):
		return ferryDash + escapeLabel(k[len(ferryDot):])
	case strings.HasPrefix(k, ferryDash):
		return "ferry_2d" + escapeLabel(k[len(ferryDash):])
	}
	return escapeLabel(k)
}

func decodeLabelKey(k string) (string, error) {
	if rest, ok := strings.CutPrefix(k, ferryDash); ok {
		v, err := unescapeLabel(rest)
		return ferryDot + v, err
	}
	return unescapeLabel(k)
}

func escapeLabel(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' {
			b.WriteByte(c)
			continue
		}
		fmt.Fprintf(&b, "_%02x", c)
	}
	return b.String()
}

func unescapeLabel(s string) (string, error) {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '_' {
			b.WriteByte(s[i])
			continue
		}
		if i+2 >= len(s) {
			return "", fmt.Errorf("label %q: truncated escape at %d", s, i)
		}
		c, err := strconv.ParseUint(s[i+1:i+3], 16, 8)
		if err != nil {
			return "", fmt.Errorf("label %q: bad escape at %d", s, i)
		}
		b.WriteByte(byte(c))
		i += 2
	}
	return b.String(), nil
}

// encodeLabels maps Ferry labels to GCP labels.
func encodeLabels(labels map[string]string) map[string]string {
	out := make(map[string]string, len(labels))
	for k, v := range labels {
		out[encodeLabelKey(k)] = escapeLabel(v)
	}
	return out
}

// decodeLabels maps GCP labels back; a label Ferry did not write and cannot decode is kept
// as it is.
func decodeLabels(labels map[string]string) map[string]string {
	out := make(map[string]string, len(labels))
	for k, v := range labels {
		dk, err := decodeLabelKey(k)
		if err != nil {
			dk = k
		}
		dv, err := unescapeLabel(v)
		if err != nil {
			dv = v
		}
		out[dk] = dv
	}
	return out
}

// labelFilter is a Compute list filter matching every label of selector (already encoded):
// `(labels.ferry-managed = "true") (labels.ferry-service = "chat")`. Compute ANDs
// parenthesised expressions.
func labelFilter(encoded map[string]string) string {
	keys := make([]string, 0, len(encoded))
	for k := range encoded {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("(labels.%s = %q)", k, encoded[k])
	}
	return strings.Join(parts, " ")
}
