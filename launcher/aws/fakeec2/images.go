package fakeec2

import (
	"encoding/xml"
	"path"
	"slices"
	"strings"
)

// Public images every region of the fake has, as EC2 lists them: the owners and name patterns
// the provider searches (AWS's Deep Learning Base GPU AMI, Canonical's Ubuntu), each in an
// older and a newer build so that picking the newest is tested.
var publicImages = []xmlImage{
	{ImageID: "ami-0d1a0000000000001", Name: "Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04) 20260101", OwnerID: amazonOwner, OwnerAlias: "amazon", CreationDate: "2026-01-01T00:00:00.000Z"},
	{ImageID: "ami-0d1a0000000000002", Name: "Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04) 20261101", OwnerID: amazonOwner, OwnerAlias: "amazon", CreationDate: "2026-11-01T00:00:00.000Z"},
	{ImageID: "ami-0c0a0000000000001", Name: "ubuntu/images/hvm-ssd/ubuntu-jammy-22.04-amd64-server-20260101", OwnerID: canonicalOwner, CreationDate: "2026-01-01T00:00:00.000Z"},
	{ImageID: "ami-0c0a0000000000002", Name: "ubuntu/images/hvm-ssd/ubuntu-jammy-22.04-amd64-server-20261101", OwnerID: canonicalOwner, CreationDate: "2026-11-01T00:00:00.000Z"},
}

const (
	amazonOwner    = "898082745236"
	canonicalOwner = "099720109477"
)

type xmlImage struct {
	ImageID        string `xml:"imageId"`
	Name           string `xml:"name"`
	OwnerID        string `xml:"imageOwnerId"`
	OwnerAlias     string `xml:"imageOwnerAlias,omitempty"`
	CreationDate   string `xml:"creationDate"`
	State          string `xml:"imageState"`
	Architecture   string `xml:"architecture"`
	RootDeviceName string `xml:"rootDeviceName"`
}

type describeImagesResponse struct {
	XMLName xml.Name `xml:"DescribeImagesResponse"`
	meta
	Images []xmlImage `xml:"imagesSet>item"`
}

// describeImages lists the public images matching Owner.N (an id or alias) and the name,
// state and architecture filters (name patterns use * as EC2 does).
func (s *Server) describeImages(m meta, p params) (any, *APIError) {
	owners := p.list("Owner")
	f := p.filters()
	out := &describeImagesResponse{meta: m}
	if ids := p.list("ImageId"); len(ids) > 0 {
		// RunInstances takes any ami- id, so every such id names an image here.
		for _, id := range ids {
			if !strings.HasPrefix(id, "ami-") {
				return nil, apiErr("InvalidAMIID.Malformed", "Invalid id: %q (expecting \"ami-...\")", id)
			}
			out.Images = append(out.Images, xmlImage{ImageID: id, Name: id, State: "available", Architecture: "x86_64", RootDeviceName: defaultRootDevice})
		}
		return out, nil
	}
	for _, img := range publicImages {
		img.State, img.Architecture, img.RootDeviceName = "available", "x86_64", defaultRootDevice
		if len(owners) > 0 && !slices.Contains(owners, img.OwnerID) && (img.OwnerAlias == "" || !slices.Contains(owners, img.OwnerAlias)) {
			continue
		}
		if !matchAny(f["name"], img.Name) || !matchAny(f["state"], img.State) || !matchAny(f["architecture"], img.Architecture) {
			continue
		}
		out.Images = append(out.Images, img)
	}
	return out, nil
}

// matchAny reports whether v matches one of the patterns, or there are none.
func matchAny(patterns []string, v string) bool {
	if len(patterns) == 0 {
		return true
	}
	for _, pat := range patterns {
		if ok, _ := path.Match(pat, v); ok {
			return true
		}
	}
	return false
}
