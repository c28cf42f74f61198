package configs

import (
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"
)

// FerryConfig is Ferry's own settings file, $FERRY_HOME/config.yaml (like SkyPilot's
// ~/.sky/config.yaml): which infras replicas may use, beyond the embedded local one.
//
//	kubernetes:
//	  kubeconfig: ~/.kube/config        # default: $KUBECONFIG, then ~/.kube/config
//	  provision_timeout_seconds: 60     # unschedulable this long = no capacity: burst elsewhere
//	  contexts:                         # in preference order; default: the current context
//	    - name: gpu-cluster
//	      namespace: ferry              # default: the context's namespace, else default
//	      cost_per_hour: 0              # what one pod is taken to cost; default 0
//	  proxy_pod_labels: {app.kubernetes.io/name: ferry}  # the pods that may reach replicas' service port:
//	  proxy_namespace: ferry-system     # the controller's and proxies' (default: those labels, in the
//	                                    # replicas' namespace)
//	  proxy_cidrs: [203.0.113.7/32]     # and addresses, for a controller outside the cluster
//	  gpu_scheduler_name: hami-scheduler  # the scheduler of pods that share a GPU (HAMi's)
//	  serving_priority: 1000            # services' PriorityClass value; jobs' keep their distance
//	  max_priority: 1000                # no PriorityClass Ferry creates or uses is above (default: none)
//	aws:                                # enables AWS (credentials: the SDK's default chain)
//	  regions: [us-east-1, us-west-2]   # where replicas may go; default us-east-1
//	  endpoint: http://127.0.0.1:4566   # an EC2-compatible endpoint (tests, other clouds)
//	  amis: {us-east-1: ami-0abc}       # image per region for tasks without image_id (default:
//	                                    # the newest Deep Learning Base AMI, or Ubuntu 22.04 without GPUs)
//	  proxy_cidrs: [10.0.3.0/24]        # who may reach replicas' service port: the controller and
//	  proxy_security_groups: [sg-0abc1234]  # attached proxies (default: the controller's own address)
//	gcp:                                # enables GCP (credentials: Application Default Credentials)
//	  project: my-project               # required
//	  regions: [us-central1]            # default us-central1
//	  endpoint: http://127.0.0.1:4567   # a Compute-compatible endpoint
//	  proxy_cidrs: [10.128.0.5/32]      # who may reach replicas' service port: the controller and
//	  proxy_tags: [ferry-proxy]         # attached proxies (default: the controller's own address)
type FerryConfig struct {
	// Kubernetes is nil when the file has no kubernetes section.
	Kubernetes *KubernetesConfig `json:"kubernetes,omitempty" yaml:"kubernetes"`
	// AWS and GCP are nil when their sections are absent (the cloud is not enabled).
	AWS *CloudConfig `json:"aws,omitempty" yaml:"aws"`
	GCP *CloudConfig `json:"gcp,omitempty" yaml:"gcp"`
	// Local describes this machine's GPUs (nil: none); see LocalConfig.
	Local *LocalConfig `json:"local,omitempty" yaml:"local"`
	// Source is the file read, for messages.
	Source string `json:"-" yaml:"-"`
}

// KubernetesConfig is the kubernetes section.
type KubernetesConfig struct {
	Kubeconfig              string              `json:"kubeconfig,omitempty" yaml:"kubeconfig"`
	ProvisionTimeoutSeconds int                 `json:"provision_timeout_seconds,omitempty" yaml:"provision_timeout_seconds"`
	Contexts                []KubernetesContext `json:"contexts,omitempty" yaml:"contexts"`
	// ProxyPodLabels and ProxyNamespace select the pods (the controller's and attached
	// proxies') that each service's NetworkPolicy admits to its replicas' port; ProxyCIDRs
	// add addresses. Empty: the provider's defaults (app.kubernetes.io/name=ferry, in the
	// replicas' namespace).
	ProxyPodLabels map[string]string `json:"proxy_pod_labels,omitempty" yaml:"proxy_pod_labels"`
	ProxyNamespace string            `json:"proxy_namespace,omitempty" yaml:"proxy_namespace"`
	ProxyCIDRs     []string          `json:"proxy_cidrs,omitempty" yaml:"proxy_cidrs"`
	// CheckpointSize and CheckpointStorageClass shape the PersistentVolumeClaim a job's
	// checkpoint lives in ("10Gi" and the cluster's default class when empty). A gang's claim
	// is ReadWriteMany, which the class must offer.
	CheckpointSize         string `json:"checkpoint_size,omitempty" yaml:"checkpoint_size"`
	CheckpointStorageClass string `json:"checkpoint_storage_class,omitempty" yaml:"checkpoint_storage_class"`
	// GPUSchedulerName is the schedulerName of pods that share a GPU ("" is HAMi's
	// hami-scheduler); clusters that deploy HAMi under another name set it.
	GPUSchedulerName string `json:"gpu_scheduler_name,omitempty" yaml:"gpu_scheduler_name"`
	// KueueLocalQueue is the Kueue LocalQueue queued jobs are submitted to ("": detected,
	// see capacity.go).
	KueueLocalQueue string `json:"kueue_local_queue,omitempty" yaml:"kueue_local_queue"`
	// ServingPriority is the value of the PriorityClass services' pods run in (nil:
	// DefaultServingPriority, or MaxPriority when that is lower); jobs' classes keep their
	// distance to it. MaxPriority caps every class Ferry creates or uses (nil: no cap but the
	// API's): the cluster admin's bound, so that Ferry's pods never preempt pods above it.
	ServingPriority *int `json:"serving_priority,omitempty" yaml:"serving_priority"`
	MaxPriority     *int `json:"max_priority,omitempty" yaml:"max_priority"`
}

// DefaultServingPriority is the Kubernetes priority of services' pods when the config sets
// none: ServingPriority, where services stand against jobs.
const DefaultServingPriority = ServingPriority

// maxUserPriority bounds PriorityClass values: the API reserves those above 1e9 for the
// system's classes.
const maxUserPriority = 1_000_000_000

// CloudConfig is the aws or gcp section.
type CloudConfig struct {
	// Project is GCP's project id (required there; AWS has none).
	Project string   `json:"project,omitempty" yaml:"project"`
	Regions []string `json:"regions,omitempty" yaml:"regions"`
	// Zones (GCP) narrows the cloud to these zones: where the project may not use every zone
	// of its regions, Ferry neither plans, launches nor lists beyond them. Their regions are
	// enabled with them.
	Zones []string `json:"zones,omitempty" yaml:"zones"`
	// Endpoint overrides the API endpoint: an in-project fake in tests, or a compatible cloud.
	Endpoint string `json:"endpoint,omitempty" yaml:"endpoint"`
	// AMIs is AWS's image per region for tasks that set no image_id.
	AMIs map[string]string `json:"amis,omitempty" yaml:"amis"`
	// ProxyCIDRs, and AWS's ProxySecurityGroups or GCP's ProxyTags (network tags), are all
	// that may reach replicas' service port: the controller and its attached proxies. Empty:
	// the controller alone, at the address its host sends from to each replica.
	ProxyCIDRs          []string `json:"proxy_cidrs,omitempty" yaml:"proxy_cidrs"`
	ProxySecurityGroups []string `json:"proxy_security_groups,omitempty" yaml:"proxy_security_groups"`
	ProxyTags           []string `json:"proxy_tags,omitempty" yaml:"proxy_tags"`
	// CheckpointNFS is an NFSv4 share, "server:/export" (an EFS file system on AWS, a
	// Filestore share on GCP), that job nodes mount for their checkpoints so that a recovery
	// within its reach resumes; empty keeps each VM's checkpoint on its own disk.
	CheckpointNFS string `json:"checkpoint_nfs,omitempty" yaml:"checkpoint_nfs"`
	// MountInstanceProfile (AWS) is the IAM instance profile of VMs that mount s3:// buckets
	// (file_mounts mode MOUNT, MOUNT_CACHED; launcher/nodefiles/mounts.go); empty refuses such mounts.
	MountInstanceProfile string `json:"mount_instance_profile,omitempty" yaml:"mount_instance_profile"`
}

// Default regions when a cloud section names none: the catalog's cheapest, most available.
const (
	DefaultAWSRegion = "us-east-1"
	DefaultGCPRegion = "us-central1"
)

// KubernetesContext is one allowed context.
type KubernetesContext struct {
	Name        string  `json:"name" yaml:"name"`
	Namespace   string  `json:"namespace,omitempty" yaml:"namespace"`
	CostPerHour float64 `json:"cost_per_hour,omitempty" yaml:"cost_per_hour"`
	// QueuedProvisioning is set for a context whose cluster provisions nodes for queued
	// requests (GKE's queued provisioning), nil otherwise (capacity.go).
	QueuedProvisioning *QueuedProvisioning `json:"queued_provisioning,omitempty" yaml:"queued_provisioning"`
}

var (
	ferryConfigKeys = keysOf[FerryConfig]()
	// aws and gcp share CloudConfig, and each takes only the fields its cloud has.
	awsKeys           = []string{"regions", "endpoint", "amis", "proxy_cidrs", "proxy_security_groups", "checkpoint_nfs", "mount_instance_profile"}
	gcpKeys           = []string{"project", "regions", "zones", "endpoint", "proxy_cidrs", "proxy_tags", "checkpoint_nfs"}
	kubernetesKeys    = keysOf[KubernetesConfig]()
	kubeContextKeys   = keysOf[KubernetesContext]()
	maxKubeContexts   = 64
	maxProvisionDelay = 24 * 3600
)

// LoadFerryConfig reads path. A missing file is the empty config (local infra only).
func LoadFerryConfig(path string) (*FerryConfig, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return &FerryConfig{Source: path}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("configs: read %s: %w", path, err)
	}
	return ParseFerryConfig(path, data)
}

// ParseFerryConfig parses and validates a config file; errors carry file, line and field like
// a task's.
func ParseFerryConfig(filename string, data []byte) (cfg *FerryConfig, err error) {
	c := newChecker(filename)
	defer func() {
		if r := recover(); r != nil {
			cfg = nil
			err = &Error{File: filename, Msg: fmt.Sprintf("internal error while validating (please report): %v", r)}
		}
	}()
	out := &FerryConfig{Source: filename}
	if len(strings.TrimSpace(string(data))) == 0 {
		return out, nil
	}
	root := c.document(data)
	if root == nil {
		return nil, c.err()
	}
	f, _ := c.fields(root, "", ferryConfigKeys)
	if e, ok := f["kubernetes"]; ok {
		out.Kubernetes = c.kubernetesConfig(e.value)
	}
	// `aws:` with nothing under it enables the cloud with its defaults (fields drops nulls).
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]
		if isNull(v) && k.Value == "aws" {
			out.AWS = &CloudConfig{Regions: []string{DefaultAWSRegion}}
		}
		if isNull(v) && k.Value == "gcp" {
			c.errorf(k, "gcp.project", "required: the GCP project to launch VMs in")
		}
	}
	if e, ok := f["local"]; ok {
		out.Local = c.localConfig(e.value)
	}
	if e, ok := f["aws"]; ok {
		out.AWS = c.cloudConfig(e.value, "aws", awsKeys, DefaultAWSRegion)
	}
	if e, ok := f["gcp"]; ok {
		out.GCP = c.cloudConfig(e.value, "gcp", gcpKeys, DefaultGCPRegion)
		if out.GCP.Project == "" {
			c.errorf(e.keyNode, "gcp.project", "required: the GCP project to launch VMs in")
		}
	}
	if err := c.err(); err != nil {
		return nil, err
	}
	return out, nil
}

// quantityRE is a Kubernetes storage quantity in binary or decimal units.
var quantityRE = regexp.MustCompile(`^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)?$`)

// dnsSubdomainRE is a Kubernetes object name (a DNS subdomain).
var dnsSubdomainRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)

func (c *checker) kubernetesConfig(n *yaml.Node) *KubernetesConfig {
	const field = "kubernetes"
	k := &KubernetesConfig{}
	f, ok := c.fields(n, field, kubernetesKeys)
	if !ok {
		return k
	}
	if e, ok := f["kubeconfig"]; ok {
		k.Kubeconfig, _ = c.str(e.value, joinField(field, "kubeconfig"))
		k.Kubeconfig = expandHome(k.Kubeconfig)
	}
	if e, ok := f["provision_timeout_seconds"]; ok {
		fld := joinField(field, "provision_timeout_seconds")
		if v, ok := c.intAtLeast(e.value, fld, 1); ok {
			if v > maxProvisionDelay {
				c.errorf(e.value, fld, "must be at most %d (a day), got %d", maxProvisionDelay, v)
			}
			k.ProvisionTimeoutSeconds = v
		}
	}
	c.kubernetesProxies(f, k)
	if v, ok := c.matching(f, field, "checkpoint_size", quantityRE, "is not a storage size such as 10Gi or 500Mi"); ok {
		k.CheckpointSize = v
	}
	if v, ok := c.matching(f, field, "checkpoint_storage_class", dnsSubdomainRE, "is not a storage class name"); ok {
		k.CheckpointStorageClass = v
	}
	if v, ok := c.matching(f, field, "gpu_scheduler_name", dnsSubdomainRE, "is not a scheduler name (lowercase letters, digits, '-' and '.')"); ok {
		k.GPUSchedulerName = v
	}
	if e, ok := f["kueue_local_queue"]; ok {
		k.KueueLocalQueue = c.kueueLocalQueue(e.value, joinField(field, "kueue_local_queue"))
	}
	c.kubernetesPriorities(f, k)
	if e, ok := f["contexts"]; ok {
		fld := joinField(field, "contexts")
		items := c.deref(e.value)
		if items.Kind != yaml.SequenceNode {
			c.errorf(e.value, fld, "expected a list of contexts ({name, namespace, cost_per_hour}), got %s", describe(items))
			return k
		}
		if len(items.Content) > maxKubeContexts {
			c.errorf(e.value, fld, "at most %d contexts, got %d", maxKubeContexts, len(items.Content))
			return k
		}
		var names []string
		for i, item := range items.Content {
			ctx, ok := c.kubeContext(item, indexField(fld, i))
			if !ok {
				continue
			}
			if slices.Contains(names, ctx.Name) {
				c.errorf(item, indexField(fld, i), "context %s is listed twice", quoteShort(ctx.Name))
				continue
			}
			names = append(names, ctx.Name)
			k.Contexts = append(k.Contexts, ctx)
		}
	}
	return k
}

// kubernetesPriorities reads serving_priority and max_priority, which must not cross.
func (c *checker) kubernetesPriorities(f map[string]entry, k *KubernetesConfig) {
	read := func(key string) *int {
		e, ok := f[key]
		if !ok {
			return nil
		}
		fld := joinField("kubernetes", key)
		v, ok := c.integer(e.value, fld)
		if ok && (v > maxUserPriority || v < -maxUserPriority) {
			c.errorf(e.value, fld, "must be between -%d and %d (higher values are the system's), got %d", maxUserPriority, maxUserPriority, v)
			return nil
		}
		if !ok {
			return nil
		}
		return &v
	}
	k.ServingPriority, k.MaxPriority = read("serving_priority"), read("max_priority")
	if k.ServingPriority != nil && k.MaxPriority != nil && *k.ServingPriority > *k.MaxPriority {
		c.errorf(f["serving_priority"].value, joinField("kubernetes", "serving_priority"),
			"%d is above kubernetes.max_priority %d: set it at most %d, or ask the cluster's admin for a higher cap", *k.ServingPriority, *k.MaxPriority, *k.MaxPriority)
	}
}

// kubernetesProxies reads proxy_pod_labels, proxy_namespace and proxy_cidrs.
func (c *checker) kubernetesProxies(f map[string]entry, k *KubernetesConfig) {
	if e, ok := f["proxy_pod_labels"]; ok {
		fld := joinField("kubernetes", "proxy_pod_labels")
		ps, ok := c.pairs(e.value, fld)
		if ok && len(ps) == 0 {
			// An empty selector would admit every pod of the namespace.
			c.errorf(e.value, fld, "expected at least one label")
		}
		for _, p := range ps {
			kf := joinField(fld, p.key)
			if !labelKeyRE.MatchString(p.key) || len(p.key) > 317 {
				c.errorf(p.keyNode, kf, "%s is not a label key ([prefix/]name, name at most 63 characters)", quoteShort(p.key))
				continue
			}
			if v, ok := c.str(p.value, kf); ok {
				if !labelValueRE.MatchString(v) {
					c.errorf(p.value, kf, "%s is not a label value (at most 63 letters, digits, -, _ and ., starting and ending with a letter or digit)", quoteShort(v))
					continue
				}
				if k.ProxyPodLabels == nil {
					k.ProxyPodLabels = map[string]string{}
				}
				k.ProxyPodLabels[p.key] = v
			}
		}
	}
	if e, ok := f["proxy_namespace"]; ok {
		fld := joinField("kubernetes", "proxy_namespace")
		if ns, ok := c.str(e.value, fld); ok {
			if !dnsLabelRE.MatchString(ns) {
				c.errorf(e.value, fld, "%s is not a namespace name (lowercase letters, digits and -, at most 63)", quoteShort(ns))
			}
			k.ProxyNamespace = ns
		}
	}
	if e, ok := f["proxy_cidrs"]; ok {
		k.ProxyCIDRs = c.stringList(e.value, joinField("kubernetes", "proxy_cidrs"), checkCIDR)
	}
}

// Kubernetes label keys ([DNS subdomain prefix/]name) and values.
var (
	labelKeyRE   = regexp.MustCompile(`^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$`)
	labelValueRE = regexp.MustCompile(`^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$`)
)

// cloudConfig reads an aws or gcp section. An empty section (`aws: {}`) enables the cloud with
// its defaults.
// nfsShare reads an NFS share, "server:/export".
func (c *checker) nfsShare(n *yaml.Node, field string) string {
	v, ok := c.str(n, field)
	if !ok {
		return ""
	}
	if host, export, found := strings.Cut(v, ":"); !found || host == "" || !strings.HasPrefix(export, "/") {
		c.errorf(n, field, "%s is not an NFS share: write server:/export, e.g. fs-0123456789abcdef0.efs.us-east-1.amazonaws.com:/", quoteShort(v))
		return ""
	}
	return v
}

// zones reads gcp.zones: zone names (REGION-LETTER), each enabling its region.
func (c *checker) zones(n *yaml.Node, field string, cc *CloudConfig) {
	items := c.deref(n)
	if items.Kind != yaml.SequenceNode || len(items.Content) == 0 {
		c.errorf(n, field, "expected a non-empty list of zones, got %s", describe(items))
		return
	}
	for i, item := range items.Content {
		v, ok := c.str(item, indexField(field, i))
		if !ok {
			continue
		}
		cut := strings.LastIndexByte(v, '-')
		if !regionRE.MatchString(v) || cut <= 0 || len(v)-cut != 2 {
			c.errorf(item, indexField(field, i), "%s is not a zone name (REGION-x, e.g. us-central1-a)", quoteShort(v))
			continue
		}
		if slices.Contains(cc.Zones, v) {
			c.errorf(item, indexField(field, i), "zone %s is listed twice", quoteShort(v))
			continue
		}
		cc.Zones = append(cc.Zones, v)
		if region := v[:cut]; !slices.Contains(cc.Regions, region) {
			cc.Regions = append(cc.Regions, region)
		}
	}
}

func (c *checker) cloudConfig(n *yaml.Node, field string, keys []string, defaultRegion string) *CloudConfig {
	cc := &CloudConfig{}
	n = c.deref(n)
	if isNull(n) {
		cc.Regions = []string{defaultRegion}
		return cc
	}
	f, ok := c.fields(n, field, keys)
	if !ok {
		return cc
	}
	if e, ok := f["project"]; ok {
		fld := joinField(field, "project")
		if v, ok := c.str(e.value, fld); ok {
			if !gcpProjectRE.MatchString(v) {
				c.errorf(e.value, fld, "%s is not a project id (6-30 lowercase letters, digits and -, starting with a letter)", quoteShort(v))
			}
			cc.Project = v
		}
	}
	c.cloudStorage(f, field, cc)
	if e, ok := f["regions"]; ok {
		cc.Regions = c.regions(e.value, joinField(field, "regions"))
	}
	if e, ok := f["zones"]; ok {
		c.zones(e.value, joinField(field, "zones"), cc)
	}
	if len(cc.Regions) == 0 {
		cc.Regions = []string{defaultRegion}
	}
	if e, ok := f["amis"]; ok {
		cc.AMIs = c.amis(e.value, joinField(field, "amis"))
	}
	if e, ok := f["proxy_cidrs"]; ok {
		cc.ProxyCIDRs = c.stringList(e.value, joinField(field, "proxy_cidrs"), checkCIDR)
	}
	if e, ok := f["proxy_security_groups"]; ok {
		cc.ProxySecurityGroups = c.stringList(e.value, joinField(field, "proxy_security_groups"), func(v string) string {
			if !securityGroupRE.MatchString(v) {
				return "is not a security group id (sg- and 8 or 17 hex digits)"
			}
			return ""
		})
	}
	if e, ok := f["proxy_tags"]; ok {
		cc.ProxyTags = c.stringList(e.value, joinField(field, "proxy_tags"), func(v string) string {
			if !networkTagRE.MatchString(v) {
				return "is not a network tag (lowercase letters, digits and -, starting with a letter, at most 63)"
			}
			return ""
		})
	}
	if e, ok := f["endpoint"]; ok {
		fld := joinField(field, "endpoint")
		if v, ok := c.str(e.value, fld); ok {
			if u, err := url.Parse(v); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				c.errorf(e.value, fld, "%s is not an http(s) URL", quoteShort(v))
			}
			cc.Endpoint = v
		}
	}
	return cc
}

// stringList reads a non-empty list of distinct strings, each passing check (which answers
// what is wrong, or "").
func (c *checker) stringList(n *yaml.Node, field string, check func(string) string) []string {
	items := c.deref(n)
	if items.Kind != yaml.SequenceNode || len(items.Content) == 0 {
		c.errorf(n, field, "expected a non-empty list, got %s", describe(items))
		return nil
	}
	var out []string
	for i, item := range items.Content {
		v, ok := c.str(item, indexField(field, i))
		switch {
		case !ok:
		case check(v) != "":
			c.errorf(item, indexField(field, i), "%s %s", quoteShort(v), check(v))
		case slices.Contains(out, v):
			c.errorf(item, indexField(field, i), "%s is listed twice", quoteShort(v))
		default:
			out = append(out, v)
		}
	}
	return out
}

// checkCIDR accepts an address range written as an address and a prefix length.
func checkCIDR(v string) string {
	if _, err := netip.ParsePrefix(v); err != nil {
		return "is not a CIDR block (an address and a prefix length: 10.0.3.0/24, 203.0.113.7/32)"
	}
	return ""
}

// networkTagRE is a GCE network tag (an RFC 1035 label).
var networkTagRE = regexp.MustCompile(`^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$`)

// securityGroupRE is an EC2 security group id.
var securityGroupRE = regexp.MustCompile(`^sg-([0-9a-f]{8}|[0-9a-f]{17})$`)

// gcpProjectRE is a GCP project id.
var gcpProjectRE = regexp.MustCompile(`^[a-z][-a-z0-9]{4,28}[a-z0-9]$`)

func (c *checker) kubeContext(n *yaml.Node, field string) (KubernetesContext, bool) {
	var ctx KubernetesContext
	n = c.deref(n)
	if isScalar(n, "!!str") {
		// A bare name is allowed: `contexts: [a, b]`.
		ctx.Name = n.Value
	} else {
		f, ok := c.fields(n, field, kubeContextKeys)
		if !ok {
			return ctx, false
		}
		if e, ok := f["name"]; ok {
			ctx.Name, _ = c.str(e.value, joinField(field, "name"))
		} else {
			c.errorf(n, field, "a context needs a name")
			return ctx, false
		}
		if e, ok := f["namespace"]; ok {
			fld := joinField(field, "namespace")
			if ns, ok := c.str(e.value, fld); ok {
				if !dnsLabelRE.MatchString(ns) {
					c.errorf(e.value, fld, "%s is not a namespace name (lowercase letters, digits and -, at most 63)", quoteShort(ns))
				}
				ctx.Namespace = ns
			}
		}
		if e, ok := f["cost_per_hour"]; ok {
			fld := joinField(field, "cost_per_hour")
			if v, ok := c.number(e.value, fld); ok {
				if v < 0 {
					c.errorf(e.value, fld, "must be 0 or more, got %s", e.value.Value)
				}
				ctx.CostPerHour = v
			}
		}
		if e, ok := f["queued_provisioning"]; ok {
			ctx.QueuedProvisioning = c.queuedProvisioning(e.value, joinField(field, "queued_provisioning"))
		}
	}
	if strings.TrimSpace(ctx.Name) == "" {
		c.errorf(n, field, "empty context name")
		return ctx, false
	}
	return ctx, true
}

// dnsLabelRE is a Kubernetes namespace (an RFC 1123 label).
var dnsLabelRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

// matching reads the optional string f[key] and returns it when re matches it; otherwise it
// reports "VALUE <why>" at the value and returns false.
func (c *checker) matching(f map[string]entry, field, key string, re *regexp.Regexp, why string) (string, bool) {
	e, ok := f[key]
	if !ok {
		return "", false
	}
	fld := joinField(field, key)
	v, ok := c.str(e.value, fld)
	if !ok {
		return "", false
	}
	if !re.MatchString(v) {
		c.errorf(e.value, fld, "%s %s", quoteShort(v), why)
		return "", false
	}
	return v, true
}

// regions reads a cloud's regions: a non-empty list of distinct region names.
func (c *checker) regions(n *yaml.Node, fld string) []string {
	var out []string
	items := c.deref(n)
	if items.Kind != yaml.SequenceNode || len(items.Content) == 0 {
		c.errorf(n, fld, "expected a non-empty list of regions, got %s", describe(items))
		return nil
	}
	for i, item := range items.Content {
		v, ok := c.str(item, indexField(fld, i))
		switch {
		case !ok:
		case !regionRE.MatchString(v):
			c.errorf(item, indexField(fld, i), "%s is not a region name (lowercase letters, digits and -)", quoteShort(v))
		case slices.Contains(out, v):
			c.errorf(item, indexField(fld, i), "region %s is listed twice", quoteShort(v))
		default:
			out = append(out, v)
		}
	}
	return out
}

// amis reads aws.amis: an AMI id per region.
func (c *checker) amis(n *yaml.Node, fld string) map[string]string {
	ps, ok := c.pairs(n, fld)
	if !ok {
		return nil
	}
	out := map[string]string{}
	for _, p := range ps {
		kf := joinField(fld, p.key)
		if !regionRE.MatchString(p.key) {
			c.errorf(p.keyNode, kf, "%s is not a region name", quoteShort(p.key))
			continue
		}
		if v, ok := c.str(p.value, kf); ok {
			if !strings.HasPrefix(v, "ami-") {
				c.errorf(p.value, kf, "%s is not an AMI id (ami-...)", quoteShort(v))
				continue
			}
			out[p.key] = v
		}
	}
	return out
}
