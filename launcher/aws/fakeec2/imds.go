package fakeec2

import (
	"encoding/base64"
	"encoding/json"
	"maps"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"
)

// imdsPrefix is where the fake serves each instance's metadata service: URL()+imdsPrefix+ID
// stands for http://169.254.169.254 on that instance (EnvIMDSEndpoint).
const imdsPrefix = "/_imds/"

// imdsToken is an IMDSv2 session token: the instance it was issued on and when it expires.
type imdsToken struct {
	instance string
	expires  time.Time
}

// serveIMDS answers the instance metadata service of one instance, IMDSv2 as EC2 does for
// the paths Ferry's boot scripts read: PUT latest/api/token (with
// X-aws-ec2-metadata-token-ttl-seconds, 1 to 21600) issues a session token; a GET must carry
// one when the instance's HttpTokens is required (401 without, or with an expired one); an
// endpoint that is disabled answers 403. meta-data/ serves instance-id, local-ipv4,
// placement/availability-zone, tags/instance[/KEY] (only with InstanceMetadataTags enabled,
// else 404, as EC2), iam/security-credentials/[ROLE] (an instance launched with an IAM
// instance profile: its role, named as the profile, and that role's temporary credentials,
// RoleAccessKey's; 404 without one) and spot/instance-action (404 until the instance gets its interruption
// warning, then EC2's {"action":"terminate","time":...}). Not modelled: the hop limit (every
// request here comes from the host), IPv6, and requests with X-Forwarded-For, which EC2
// refuses for tokens.
func (s *Server) serveIMDS(w http.ResponseWriter, r *http.Request, rest string) {
	id, path, _ := strings.Cut(rest, "/")
	s.mu.Lock()
	defer s.mu.Unlock()
	s.advance()
	in := s.instances[id]
	if in == nil || !in.live() {
		// The machine is gone; nothing answers on it.
		http.Error(w, "no such instance", http.StatusBadGateway)
		return
	}
	if in.metadata.HTTPEndpoint == "disabled" {
		http.Error(w, "Forbidden", http.StatusForbidden)
		return
	}
	now := s.opts.Now()
	s.dropTokens(now)
	if path == "latest/api/token" {
		if r.Method != http.MethodPut {
			http.Error(w, "Method Not Allowed", http.StatusMethodNotAllowed)
			return
		}
		ttl, err := strconv.Atoi(r.Header.Get("X-aws-ec2-metadata-token-ttl-seconds"))
		if err != nil || ttl < 1 || ttl > 21600 {
			http.Error(w, "Bad Request", http.StatusBadRequest)
			return
		}
		tok := newID("AQAEA")
		s.imdsTokens[tok] = imdsToken{instance: id, expires: now.Add(time.Duration(ttl) * time.Second)}
		w.Header().Set("X-aws-ec2-metadata-token-ttl-seconds", strconv.Itoa(ttl))
		_, _ = w.Write([]byte(tok))
		return
	}
	if r.Method != http.MethodGet {
		http.Error(w, "Method Not Allowed", http.StatusMethodNotAllowed)
		return
	}
	tok := r.Header.Get("X-aws-ec2-metadata-token")
	if t, ok := s.imdsTokens[tok]; tok != "" && (!ok || t.instance != id || !now.Before(t.expires)) {
		http.Error(w, "Unauthorized", http.StatusUnauthorized)
		return
	} else if tok == "" && in.metadata.HTTPTokens == "required" {
		http.Error(w, "Unauthorized", http.StatusUnauthorized)
		return
	}
	key, ok := strings.CutPrefix(path, "latest/meta-data/")
	if !ok {
		http.NotFound(w, r)
		return
	}
	var body string
	switch {
	case key == "instance-id":
		body = in.id
	case key == "local-ipv4":
		body = in.privateIP
	case key == "placement/availability-zone":
		body = in.zone.name
	case key == "tags/instance" || key == "tags/instance/":
		if in.metadata.InstanceMetadataTags != "enabled" {
			http.NotFound(w, r)
			return
		}
		body = strings.Join(sortedKeys(in.tags), "\n")
	case strings.HasPrefix(key, "tags/instance/"):
		v, ok := in.tags[strings.TrimPrefix(key, "tags/instance/")]
		if in.metadata.InstanceMetadataTags != "enabled" || !ok {
			http.NotFound(w, r)
			return
		}
		body = v
	case key == "iam/security-credentials" || key == "iam/security-credentials/":
		if in.profile == "" {
			http.NotFound(w, r)
			return
		}
		body = in.profile
	case key == "iam/security-credentials/"+in.profile && in.profile != "":
		b, _ := json.Marshal(roleCredentials(in, now))
		body = string(b)
	case key == "spot/instance-action":
		if in.request == nil || in.request.reclaimAt.IsZero() {
			http.NotFound(w, r)
			return
		}
		b, _ := json.Marshal(map[string]string{"action": "terminate", "time": in.request.reclaimAt.UTC().Format(time.RFC3339)})
		body = string(b)
	default:
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Type", "text/plain")
	_, _ = w.Write([]byte(body))
}

// dropTokens forgets the expired session tokens. Callers hold s.mu.
func (s *Server) dropTokens(now time.Time) {
	for tok, t := range s.imdsTokens {
		if !now.Before(t.expires) {
			delete(s.imdsTokens, tok)
		}
	}
}

// consoleLimit is how much of the end of an instance's console output GetConsoleOutput
// returns, as EC2 does.
const consoleLimit = 64 * 1024

func (s *Server) getConsoleOutput(m meta, reg *region, p params) (any, *APIError) {
	id := p.get("InstanceId")
	if !strings.HasPrefix(id, "i-") {
		return nil, apiErr("InvalidInstanceID.Malformed", "Invalid id: \"%s\"", id)
	}
	if in := s.instances[id]; in == nil || in.region != reg.name {
		return nil, apiErr("InvalidInstanceID.NotFound", "The instance ID '%s' does not exist", id)
	}
	out := &getConsoleOutputResponse{meta: m, InstanceID: id, Timestamp: timestamp(s.opts.Now())}
	if b := s.consoleOutput(id); len(b) > 0 {
		out.Output = encodeBase64(b)
	}
	return out, nil
}

// createTags adds or replaces tags on instances (the only resources the fake tags after
// creation). EC2 applies every tag to every resource, or none when one is invalid.
func (s *Server) createTags(m meta, reg *region, p params) (any, *APIError) {
	ids := p.list("ResourceId")
	if len(ids) == 0 {
		return nil, apiErr("MissingParameter", "The request must contain the parameter ResourceId")
	}
	tags := map[string]string{}
	for i := 1; i <= p.indices("Tag"); i++ {
		k, v := p.get("Tag."+strconv.Itoa(i)+".Key"), p.get("Tag."+strconv.Itoa(i)+".Value")
		switch {
		case k == "":
			return nil, apiErr("InvalidParameterValue", "Tag key must not be empty")
		case strings.HasPrefix(strings.ToLower(k), "aws:"):
			return nil, apiErr("InvalidParameterValue", "Tag keys starting with 'aws:' are reserved for internal use")
		case len(k) > 128 || len(v) > 256:
			return nil, apiErr("InvalidParameterValue", "Tag keys are limited to 128 characters and values to 256")
		case strings.ContainsAny(v, "\n\r\t"):
			return nil, apiErr("InvalidParameterValue", "Tag value %q contains characters that are not allowed", v)
		}
		tags[k] = v
	}
	for _, id := range ids {
		if !strings.HasPrefix(id, "i-") {
			return nil, apiErr("InvalidID", "The ID '%s' is not valid (fakeec2 tags instances only)", id)
		}
		if in := s.instances[id]; in == nil || in.region != reg.name {
			return nil, apiErr("InvalidInstanceID.NotFound", "The instance ID '%s' does not exist", id)
		}
	}
	for _, id := range ids {
		maps.Copy(s.instances[id].tags, tags)
	}
	return &returnResponse{XMLName: xmlName("CreateTagsResponse"), meta: m, Return: true}, nil
}

// consoleOutput is the end of an instance's console output (its user-data's output), up to
// consoleLimit bytes. Callers hold s.mu.
func (s *Server) consoleOutput(id string) []byte {
	b, err := os.ReadFile(s.logPath(id))
	if err != nil {
		return nil
	}
	if len(b) > consoleLimit {
		b = b[len(b)-consoleLimit:]
	}
	return b
}

// ConsoleOutput is everything the instance's user-data wrote, for tests.
func (s *Server) ConsoleOutput(id string) string {
	b, _ := os.ReadFile(s.logPath(id))
	return string(b)
}

func encodeBase64(b []byte) string { return base64.StdEncoding.EncodeToString(b) }

// RoleCredentials are the temporary credentials the metadata service gives for an instance's
// role, in EC2's JSON.
type RoleCredentials struct {
	Code            string
	LastUpdated     string
	Type            string
	AccessKeyID     string `json:"AccessKeyId"`
	SecretAccessKey string
	Token           string
	Expiration      string
}

// roleCredentials are in's role's credentials, valid six hours from now.
func roleCredentials(in *instance, now time.Time) RoleCredentials {
	return RoleCredentials{Code: "Success", LastUpdated: now.UTC().Format(time.RFC3339), Type: "AWS-HMAC",
		AccessKeyID: RoleAccessKey(in.id), SecretAccessKey: "fake-role-secret-" + in.id, Token: "fake-role-session-" + in.id,
		Expiration: now.Add(6 * time.Hour).UTC().Format(time.RFC3339)}
}

// RoleAccessKey is the access key id of the role credentials an instance's metadata service
// gives: a test tells by it that a request was signed with the instance's role.
func RoleAccessKey(instanceID string) string {
	return "ASIAFAKE" + strings.ToUpper(strings.TrimPrefix(instanceID, "i-"))
}
