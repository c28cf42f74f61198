package catalog

// Networking between instances, for resources.network_tier: best. An instance type has
// high-bandwidth networking when its cloud offers a fabric for traffic between GPUs of
// different nodes on it: EFA on AWS (the instance types AWS lists as supporting the Elastic
// Fabric Adapter), GPUDirect (TCPX, TCPXO, RDMA) on GCP's A3 machine types. Gbps is the
// instance's network bandwidth as the clouds state it ("up to"). Types not listed have the
// cloud's standard networking.

// Network is an instance type's networking.
type Network struct {
	// Fabric names it: "EFA", "GPUDirect-TCPX", "GPUDirect-TCPXO", "GPUDirect-RDMA".
	Fabric string
	Gbps   int
}

var highBandwidth = map[string]map[string]Network{
	AWS: {
		"g4dn.8xlarge": {"EFA", 50}, "g4dn.12xlarge": {"EFA", 50}, "g4dn.16xlarge": {"EFA", 50}, "g4dn.metal": {"EFA", 100},
		"g5.8xlarge": {"EFA", 25}, "g5.12xlarge": {"EFA", 40}, "g5.16xlarge": {"EFA", 25}, "g5.24xlarge": {"EFA", 50}, "g5.48xlarge": {"EFA", 100},
		"g6.8xlarge": {"EFA", 25}, "g6.12xlarge": {"EFA", 40}, "g6.16xlarge": {"EFA", 25}, "g6.24xlarge": {"EFA", 50}, "g6.48xlarge": {"EFA", 100},
		"g6e.8xlarge": {"EFA", 25}, "g6e.12xlarge": {"EFA", 100}, "g6e.16xlarge": {"EFA", 35}, "g6e.24xlarge": {"EFA", 200}, "g6e.48xlarge": {"EFA", 400},
		"p3dn.24xlarge": {"EFA", 100}, "p4d.24xlarge": {"EFA", 400}, "p4de.24xlarge": {"EFA", 400},
		"p5.48xlarge": {"EFA", 3200}, "p5e.48xlarge": {"EFA", 3200}, "p5en.48xlarge": {"EFA", 3200},
	},
	GCP: {
		"a3-highgpu-8g":  {"GPUDirect-TCPX", 1000},
		"a3-megagpu-8g":  {"GPUDirect-TCPXO", 1800},
		"a3-ultragpu-8g": {"GPUDirect-RDMA", 3200},
	},
}

// HighBandwidth returns the networking of instanceType on cloud when it has a fabric between
// nodes, and false when it has the cloud's standard networking (or is unknown).
func HighBandwidth(cloud, instanceType string) (Network, bool) {
	n, ok := highBandwidth[cloud][instanceType]
	return n, ok
}
