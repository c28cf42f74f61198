package configs

import (
	"fmt"
	"strings"

	"gopkg.in/yaml.v3"
)

// bucketSchemes maps SkyPilot's storage `store` values Ferry reads to their URL schemes.
var bucketSchemes = map[string]string{"s3": "s3", "gcs": "gs"}

// skypilotStores are the `store` values SkyPilot knows (sky/data/storage.py's StoreType).
var skypilotStores = []string{"s3", "gcs", "azure", "r2", "ibm", "oci", "nebius", "coreweave"}

// namedBucket reads a storage mapping with no source: SkyPilot's {name: BUCKET, store: s3},
// which names an existing bucket (SkyPilot would create it if missing; Ferry never creates
// one, and says so in a note). It returns the bucket's URL, s3://BUCKET or gs://BUCKET, or
// "" after recording why the mapping cannot be read.
func (c *checker) namedBucket(n *yaml.Node, f map[string]entry, field string) string {
	name, hasName := f["name"]
	store, hasStore := f["store"]
	switch {
	case !hasName:
		c.errorf(n, field, "a storage mapping without source or name asks for a new bucket, which Ferry does not create: create it, upload the files and write %s: s3://BUCKET/PATH (or gs://), or {name: BUCKET, store: s3}", field)
		return ""
	case !hasStore && c.taskCloud == "":
		c.errorf(name.keyNode, joinField(field, "store"), "required with name and no source when the task may run on more than one cloud: say which store holds the bucket (store: s3 or store: gcs); SkyPilot picks an enabled cloud's own, and Ferry reads one bucket wherever the task runs")
		return ""
	}
	bucket, ok := c.str(name.value, joinField(field, "name"))
	if !ok {
		return ""
	}
	if bucket = strings.TrimSpace(bucket); bucket == "" || strings.ContainsAny(bucket, "/ ") {
		c.errorf(name.value, joinField(field, "name"), "%s is not a bucket name", quoteShort(bucket))
		return ""
	}
	kind, inferred := defaultStores[c.taskCloud], !hasStore
	if hasStore {
		if kind, ok = c.str(store.value, joinField(field, "store")); !ok {
			return ""
		}
	}
	scheme, known := bucketSchemes[strings.ToLower(kind)]
	if !known {
		c.errorf(store.value, joinField(field, "store"), "unknown store %s%s; Ferry reads s3 and gcs buckets", quoteShort(kind), suggest(strings.ToLower(kind), skypilotStores, "stores"))
		return ""
	}
	url := scheme + "://" + bucket
	how := ""
	if inferred {
		how = fmt.Sprintf(" (store %s: the task runs on %s only, as SkyPilot picks the cloud's own store)", kind, c.taskCloud)
	}
	c.notef(name.value, field, "reads the existing bucket %s%s; Ferry creates no bucket, so a launch fails if it does not exist", url, how)
	return url
}

// defaultStores is the store SkyPilot uses for a bucket named without one, by the task's cloud.
var defaultStores = map[string]string{"aws": "s3", "gcp": "gcs"}

// onlyCloud is the cloud every candidate of r names, when it is one with a store ("aws" or
// "gcp"), else "".
func onlyCloud(r Resources) string {
	cloud := ""
	for i, c := range r.Candidates() {
		if i > 0 && c.Cloud != cloud {
			return ""
		}
		cloud = c.Cloud
	}
	if _, ok := defaultStores[cloud]; !ok {
		return ""
	}
	return cloud
}
