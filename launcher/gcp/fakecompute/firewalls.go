package fakecompute

import (
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"slices"
	"time"

	"cloud.google.com/go/compute/apiv1/computepb"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// defaultPriority is a firewall rule's priority when the request gives none.
const defaultPriority = 1000

// readFirewall decodes and validates a firewall resource as GCP does. An ingress rule that
// names no source (sourceRanges, sourceTags, sourceServiceAccounts) gets 0.0.0.0/0, GCP's
// default: the whole internet.
func readFirewall(r *http.Request) (*computepb.Firewall, *apiError) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		e := errInvalid("read body: " + err.Error())
		return nil, &e
	}
	fw := &computepb.Firewall{}
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(body, fw); err != nil {
		e := errInvalid("Invalid JSON payload received. " + err.Error())
		return nil, &e
	}
	invalid := func(format string, args ...any) (*computepb.Firewall, *apiError) {
		e := errInvalid(fmt.Sprintf(format, args...))
		return nil, &e
	}
	if !nameRE.MatchString(fw.GetName()) {
		return invalid("Invalid value for field 'resource.name': '%s'.", fw.GetName())
	}
	if (len(fw.GetAllowed()) == 0) == (len(fw.GetDenied()) == 0) {
		return invalid("Invalid value for field 'resource.allowed': ''. Exactly one of allowed or denied must be specified.")
	}
	if fw.Direction == nil {
		fw.Direction = proto.String("INGRESS")
	}
	if fw.Priority == nil {
		fw.Priority = proto.Int32(defaultPriority)
	}
	if p := fw.GetPriority(); p < 0 || p > 65535 {
		return invalid("Invalid value for field 'resource.priority': '%d'. Must be between 0 and 65535.", p)
	}
	for i, cidr := range fw.GetSourceRanges() {
		if _, err := netip.ParsePrefix(cidr); err != nil {
			if _, err := netip.ParseAddr(cidr); err != nil {
				return invalid("Invalid value for field 'resource.sourceRanges[%d]': '%s'. Must be a CIDR address range that is contained in the network.", i, cidr)
			}
		}
	}
	for i, tag := range fw.GetSourceTags() {
		if !nameRE.MatchString(tag) {
			return invalid("Invalid value for field 'resource.sourceTags[%d]': '%s'.", i, tag)
		}
	}
	if fw.GetDirection() == "INGRESS" && len(fw.GetSourceRanges())+len(fw.GetSourceTags())+len(fw.GetSourceServiceAccounts()) == 0 {
		fw.SourceRanges = []string{"0.0.0.0/0"}
	}
	return fw, nil
}

func (s *Server) insertFirewall(w http.ResponseWriter, r *http.Request) {
	fw, aerr := readFirewall(r)
	if aerr != nil {
		aerr.write(w)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, dup := s.firewalls[fw.GetName()]; dup {
		errConflict("projects/" + s.opts.Project + "/global/firewalls/" + fw.GetName()).write(w)
		return
	}
	s.nextID++
	fw.Kind = proto.String("compute#firewall")
	fw.Id = proto.Uint64(s.nextID)
	fw.SelfLink = proto.String(s.baseURL() + "/global/firewalls/" + fw.GetName())
	fw.CreationTimestamp = proto.String(time.Now().Format(timeLayout))
	if fw.Network == nil {
		fw.Network = proto.String(s.baseURL() + "/global/networks/default")
	}
	s.firewalls[fw.GetName()] = fw
	op := s.newOperationLocked("", "insert", &computepb.Instance{SelfLink: fw.SelfLink, Id: fw.Id})
	s.afterDelay(op, func() {})
	writeJSON(w, op.pb)
}

// updateFirewall serves firewalls.update (PUT): the rule becomes the request's resource, every
// field, keeping its id, network, self link and creation time.
func (s *Server) updateFirewall(w http.ResponseWriter, r *http.Request) {
	fw, aerr := readFirewall(r)
	if aerr != nil {
		aerr.write(w)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	name := r.PathValue("name")
	cur, ok := s.firewalls[name]
	if !ok {
		errNotFound("projects/" + s.opts.Project + "/global/firewalls/" + name).write(w)
		return
	}
	if fw.GetName() != name {
		errInvalid(fmt.Sprintf("Invalid value for field 'resource.name': '%s'. The name cannot be changed.", fw.GetName())).write(w)
		return
	}
	fw.Kind, fw.Id, fw.SelfLink, fw.CreationTimestamp, fw.Network = cur.Kind, cur.Id, cur.SelfLink, cur.CreationTimestamp, cur.Network
	s.firewalls[name] = fw
	op := s.newOperationLocked("", "update", &computepb.Instance{SelfLink: fw.SelfLink, Id: fw.Id})
	s.afterDelay(op, func() {})
	writeJSON(w, op.pb)
}

func (s *Server) deleteFirewall(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	name := r.PathValue("name")
	fw, ok := s.firewalls[name]
	if !ok {
		errNotFound("projects/" + s.opts.Project + "/global/firewalls/" + name).write(w)
		return
	}
	delete(s.firewalls, name)
	op := s.newOperationLocked("", "delete", &computepb.Instance{SelfLink: fw.SelfLink, Id: fw.Id})
	s.afterDelay(op, func() {})
	writeJSON(w, op.pb)
}

func (s *Server) getFirewall(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fw, ok := s.firewalls[r.PathValue("name")]
	if !ok {
		errNotFound("projects/" + s.opts.Project + "/global/firewalls/" + r.PathValue("name")).write(w)
		return
	}
	writeJSON(w, fw)
}

// Firewall returns a copy of the named firewall rule.
func (s *Server) Firewall(name string) (*computepb.Firewall, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fw, ok := s.firewalls[name]
	if !ok {
		return nil, false
	}
	return proto.CloneOf(fw), true
}

// Firewalls returns the names of every firewall rule, for tests.
func (s *Server) Firewalls() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	names := make([]string, 0, len(s.firewalls))
	for name := range s.firewalls {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}
