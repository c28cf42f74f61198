package configs

import (
	"maps"
	"strings"

	"gopkg.in/yaml.v3"
)

// SkyPilot's per-region image_id, {us-east-1: ami-..., us-west-2: ami-...}: an AMI or disk
// image exists in one region, so a task that names one image per region may run only in those
// regions, each with its own image. Ferry reads the mapping as alternatives, one per region
// (an any_of, or the alternative it was written in, split in place), each with a plain
// image_id: the optimizer prices every region as usual and the launcher boots the image of the
// region it launches in.

// regionImage is one entry of a per-region image_id.
type regionImage struct {
	region, image string
	keyNode       *yaml.Node
	valueNode     *yaml.Node
}

// regionImages reads image_id's mapping form into s.
func (c *checker) regionImages(s *resourceSpec, n *yaml.Node, field string) {
	ps, ok := c.pairs(n, field)
	if !ok {
		return
	}
	if len(ps) == 0 {
		c.errorf(n, field, "empty mapping: give an image per region (us-east-1: ami-...) or leave image_id out")
		return
	}
	var out []regionImage
	for _, p := range ps {
		kf := joinField(field, p.key)
		if !regionRE.MatchString(p.key) {
			c.errorf(p.keyNode, kf, "%s is not a region name (lowercase letters, digits and -)", quoteShort(p.key))
			continue
		}
		v, ok := c.str(p.value, kf)
		if !ok {
			continue
		}
		if strings.TrimSpace(v) == "" {
			c.errorf(p.value, kf, "empty image: give the region's image or leave the region out")
			continue
		}
		out = append(out, regionImage{region: p.key, image: strings.TrimSpace(v), keyNode: p.keyNode, valueNode: p.value})
	}
	if len(out) == len(ps) {
		s.images = out
		s.given["image_id"] = n
	}
}

// splitRegionImages applies the per-region image_id maps of the top and of each alternative:
// it returns the alternatives, each with one image, and the top's map cleared. A top-level map
// with no alternatives becomes an any_of of its regions.
func (c *checker) splitRegionImages(top *resourceSpec, anyOf, ordered []resourceSpec) (outAnyOf, outOrdered []resourceSpec) {
	topImages := top.images
	top.images = nil
	if topImages != nil {
		delete(top.given, "image_id")
	}
	if topImages != nil && len(anyOf) == 0 && len(ordered) == 0 {
		if top.preferred {
			c.errorf(top.given["accelerators"], "resources.accelerators", "a list of accelerators is an order of preference, which a per-region image_id (one alternative per region) cannot keep: write a set {%s}", acceleratorSet(top.r.Accelerators))
			return nil, nil
		}
		return c.splitOne(*top, resourceSpec{given: map[string]*yaml.Node{}, node: top.node}, topImages, "resources.image_id"), nil
	}
	split := func(alts []resourceSpec, key string) []resourceSpec {
		var out []resourceSpec
		for i, alt := range alts {
			images, field := alt.images, indexField("resources."+key, i)+".image_id"
			if images == nil && alt.given["image_id"] == nil {
				images, field = topImages, "resources.image_id"
			}
			if images == nil {
				out = append(out, alt)
				continue
			}
			out = append(out, c.splitOne(*top, alt, images, field)...)
		}
		return out
	}
	return split(anyOf, "any_of"), split(ordered, "ordered")
}

// splitOne turns alt (an alternative, or an empty one standing for the top) with a
// per-region image map into one alternative per region it may run in, each with its image.
func (c *checker) splitOne(top, alt resourceSpec, images []regionImage, field string) []resourceSpec {
	infra := alt.r.Infra
	if alt.given["location"] == nil {
		infra = top.r.Infra
	}
	cloud, rest, _ := strings.Cut(infra, "/")
	region, _, _ := strings.Cut(rest, "/")
	switch {
	case cloud == InfraLocal || cloud == "kubernetes":
		c.errorf(images[0].keyNode, field, "a per-region image_id is for VMs, and %s has no regions: on kubernetes write image_id: docker:IMAGE; locally leave image_id out", cloud)
		return nil
	case region != "":
		for _, im := range images {
			if im.region == region {
				return []resourceSpec{withRegionImage(alt, infra, im)}
			}
		}
		c.errorf(images[0].keyNode, field, "no image for region %s, where this task runs (SkyPilot: image_id should contain the image for the specified region)", quoteShort(region))
		return nil
	}
	var out []resourceSpec
	for _, im := range images {
		cl := cloud
		if cl == "" || cl == "*" {
			if cl = cloudOfRegion(im.region); cl == "" {
				c.errorf(im.keyNode, joinField(field, im.region), "no cloud Ferry launches on has a region named %s: write infra: aws or gcp beside image_id", quoteShort(im.region))
				continue
			}
		}
		if problem := imageProblem(cl, im.image); problem != "" {
			c.errorf(im.valueNode, joinField(field, im.region), "%s", problem)
			continue
		}
		out = append(out, withRegionImage(alt, cl+"/"+im.region, im))
	}
	return out
}

// withRegionImage is alt pinned to infra (CLOUD/REGION[/ZONE]) with the region's image.
func withRegionImage(alt resourceSpec, infra string, im regionImage) resourceSpec {
	out := alt
	out.given = maps.Clone(alt.given)
	out.images = nil
	out.r.Infra = infra
	out.r.ImageID = im.image
	out.given["location"] = im.keyNode
	out.given["image_id"] = im.valueNode
	return out
}
