package fakecompute

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"cloud.google.com/go/compute/apiv1/computepb"
	"google.golang.org/protobuf/proto"
)

// metadataPrefix is where the fake serves each VM's metadata server: the VM's
// EnvMetadataURL is http://HOST/_metadata/ZONE/NAME, standing for
// http://metadata.google.internal on that VM.
const metadataPrefix = "/_metadata/"

// serveMetadata answers a VM's metadata server as GCE does for what Ferry's startup scripts
// read under computeMetadata/v1/: instance/attributes/ (the keys) and instance/attributes/KEY,
// instance/preempted (FALSE, TRUE once a preemption has begun), instance/id, instance/name,
// instance/zone, instance/network-interfaces/0/ip, project/project-id and, for a VM with a
// service account, instance/service-accounts/default/token (Options.ServiceAccountToken). A request must
// carry Metadata-Flavor: Google (403 without) and must not carry X-Forwarded-For (403), and
// the answer carries Metadata-Flavor: Google. A VM that is not running has no server (502).
// Not modelled: wait_for_change, recursive and JSON answers, token scopes.
func (s *Server) serveMetadata(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Metadata-Flavor") != "Google" || r.Header.Get("X-Forwarded-For") != "" {
		http.Error(w, "Missing Metadata-Flavor:Google header.", http.StatusForbidden)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	zs, ok := s.zones[r.PathValue("zone")]
	var in *instance
	if ok {
		in = zs.instances[r.PathValue("name")]
	}
	if in == nil || in.vm == nil && in.pb.GetStatus() != "RUNNING" && !in.preempting {
		http.Error(w, "no such VM", http.StatusBadGateway)
		return
	}
	pb := in.pb
	path := r.PathValue("path")
	var body string
	switch {
	case path == "instance/attributes/" || path == "instance/attributes":
		for _, it := range pb.GetMetadata().GetItems() {
			body += it.GetKey() + "\n"
		}
	case strings.HasPrefix(path, "instance/attributes/"):
		key := strings.TrimPrefix(path, "instance/attributes/")
		i := slices.IndexFunc(pb.GetMetadata().GetItems(), func(it *computepb.Items) bool { return it.GetKey() == key })
		if i < 0 {
			http.NotFound(w, r)
			return
		}
		body = pb.GetMetadata().GetItems()[i].GetValue()
	case path == "instance/preempted":
		body = "FALSE"
		if in.preempting {
			body = "TRUE"
		}
	case path == "instance/id":
		body = strconv.FormatUint(pb.GetId(), 10)
	case path == "instance/name":
		body = pb.GetName()
	case path == "instance/zone":
		body = "projects/" + s.opts.Project + "/zones/" + r.PathValue("zone")
	case path == "instance/network-interfaces/0/ip":
		body = pb.GetNetworkInterfaces()[0].GetNetworkIP()
	case path == "project/project-id":
		body = s.opts.Project
	case path == "instance/service-accounts/default/token" && len(pb.GetServiceAccounts()) > 0:
		// GCE serves a token only to a VM that has a service account.
		token := s.opts.ServiceAccountToken
		if token == "" {
			token = DefaultServiceAccountToken
		}
		body = `{"access_token":"` + token + `","expires_in":3599,"token_type":"Bearer"}`
	default:
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Metadata-Flavor", "Google")
	w.Header().Set("Content-Type", "application/text")
	_, _ = io.WriteString(w, body)
}

// metadataKeyRE is what GCE accepts as a metadata key.
var metadataKeyRE = regexp.MustCompile(`^[a-zA-Z0-9-_]{1,128}$`)

// setMetadata replaces a VM's metadata, as instances.setMetadata does: the request must carry
// the fingerprint of the metadata it replaces (412 conditionNotMet otherwise), keys are
// validated, and the change is made when the returned operation is DONE, with a new
// fingerprint.
func (s *Server) setMetadata(w http.ResponseWriter, r *http.Request) {
	req := &computepb.Metadata{}
	if !decodeBody(w, r, req) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	zone, in, ok := s.instanceAt(w, r)
	if !ok {
		return
	}
	if req.GetFingerprint() != in.pb.GetMetadata().GetFingerprint() {
		apiError{code: http.StatusPreconditionFailed, reason: "conditionNotMet", status: "FAILED_PRECONDITION",
			message: "Supplied fingerprint does not match current metadata fingerprint."}.write(w)
		return
	}
	size := 0
	for _, it := range req.GetItems() {
		if !metadataKeyRE.MatchString(it.GetKey()) {
			errInvalid(fmt.Sprintf("Invalid value for field 'metadata.items.key': '%s'.", it.GetKey())).write(w)
			return
		}
		size += len(it.GetKey()) + len(it.GetValue())
	}
	if size > 512*1024 {
		errInvalid("Metadata exceeds the 512 KB limit.").write(w)
		return
	}
	op := s.newOperationLocked(zone, "setMetadata", in.pb)
	items := req.GetItems()
	s.afterDelay(op, func() {
		in.pb.Metadata = &computepb.Metadata{Kind: proto.String("compute#metadata"), Fingerprint: proto.String(newFingerprint()), Items: items}
	})
	writeJSON(w, op.pb)
}

func newFingerprint() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return base64.StdEncoding.EncodeToString(b[:])
}

// serialLimit is how much of a VM's serial port output GCE keeps: the most recent 1 MiB.
const serialLimit = 1 << 20

// getSerialPortOutput serves instances.getSerialPortOutput for port 1, which is the VM's
// startup-script output here (on GCE it also has the firmware's, the kernel's and the guest
// agent's lines). start is a byte offset in everything the port has written; an offset that
// has scrolled out of the last 1 MiB returns from the oldest byte kept, with start saying
// where that is, and next is where the next read starts, as GCE does. The output stays after
// the VM stops, until it is deleted.
func (s *Server) getSerialPortOutput(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	zone, in, ok := s.instanceAt(w, r)
	s.mu.Unlock()
	if !ok {
		return
	}
	q := r.URL.Query()
	if p := q.Get("port"); p != "" && p != "1" {
		errInvalid("Invalid value for field 'port': '" + p + "'. fakecompute serves port 1 only.").write(w)
		return
	}
	start, err := strconv.ParseInt(q.Get("start"), 10, 64)
	if q.Get("start") != "" && (err != nil || start < 0) {
		errInvalid("Invalid value for field 'start': '" + q.Get("start") + "'.").write(w)
		return
	}
	data, _ := os.ReadFile(s.LogPath(zone, in.pb.GetName()))
	total := int64(len(data))
	oldest := max(0, total-serialLimit)
	start = min(max(start, oldest), total)
	writeJSON(w, &computepb.SerialPortOutput{
		Kind: proto.String("compute#serialPortOutput"), Contents: proto.String(string(data[start:])),
		Start: proto.Int64(start), Next: proto.Int64(total),
		SelfLink: proto.String(in.pb.GetSelfLink() + "/serialPort?port=1"),
	})
}

// SerialOutput is everything the named VM's startup script wrote, for tests.
func (s *Server) SerialOutput(zone, name string) string {
	b, _ := os.ReadFile(s.LogPath(zone, name))
	return string(b)
}
