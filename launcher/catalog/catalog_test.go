package catalog

import (
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestDefaultParsesEmbeddedData(t *testing.T) {
	c := Default()
	counts := map[string]int{}
	for _, r := range c.Rows() {
		counts[r.Cloud]++
		if _, od := r.Price(false); !od {
			if _, spot := r.Price(true); !spot {
				t.Errorf("%s %s in %s has neither price", r.Cloud, r.InstanceType, r.Zone)
			}
		}
		if strings.Contains(r.InstanceType, "-attach-") {
			t.Errorf("part row %s in %s survived composition", r.InstanceType, r.Zone)
		}
	}
	// GCP: 530 file rows − 68 g2-attach − 119 n1-attach + 584 composed n1 VMs (119
	// attachments × 5 n1 shapes, minus the 11 zones' n1-standard-16 + 1×V100, over GCP's cap).
	// AWS: 479 GPU rows + 54 CPU types (c/m/r 6i and 7i, us-east-1, one row per region).
	want := map[string]int{AWS: 479 + 54, GCP: 530 - 68 - 119 + 119*5 - 11}
	if diff := cmp.Diff(want, counts); diff != "" {
		t.Errorf("rows per cloud (-want +got):\n%s", diff)
	}
}

func TestDefaultIsSharedAcrossGoroutines(t *testing.T) {
	var wg sync.WaitGroup
	got := make([]*Catalog, 8)
	for i := range got {
		wg.Go(func() { got[i] = Default() })
	}
	wg.Wait()
	for _, c := range got {
		if c != got[0] {
			t.Fatal("Default parsed the catalog more than once")
		}
	}
}

func find(t *testing.T, cloud, accelerator string, count int, instanceType, zone string) Row {
	t.Helper()
	for _, r := range Default().Lookup(cloud, accelerator) {
		if r.AcceleratorCount == count && r.InstanceType == instanceType && r.Zone == zone {
			return r
		}
	}
	t.Fatalf("no %s %s:%d %s in %s", cloud, accelerator, count, instanceType, zone)
	return Row{}
}

func TestGCPN1Composition(t *testing.T) {
	// README example: n1-standard-8 (0.38 / 0.0963) + 1×T4 (0.35 / 0.14) in us-central1-a.
	got := find(t, GCP, "T4", 1, "n1-standard-8", "us-central1-a")
	want := Row{
		Cloud: GCP, InstanceType: "n1-standard-8", Accelerator: "T4", AcceleratorCount: 1,
		VCPUs: 8, MemoryGiB: 30, GPUMemoryMiB: 16384, OnDemandPerHour: 0.73, SpotPerHour: 0.2363,
		Region: "us-central1", Zone: "us-central1-a",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("composed VM (-want +got):\n%s", diff)
	}

	// The n1 machine stays a CPU-only VM too.
	host := find(t, GCP, "", 0, "n1-standard-8", "us-central1-a")
	if host.OnDemandPerHour != 0.38 || host.Accelerator != "" {
		t.Errorf("CPU-only n1-standard-8 = %+v", host)
	}
}

func TestGCPN1RespectsAttachLimits(t *testing.T) {
	shapes := map[string]map[int][]string{}
	for _, r := range Default().Lookup(GCP, "V100") {
		if r.Zone != "us-central1-a" {
			continue
		}
		if shapes[r.Accelerator] == nil {
			shapes[r.Accelerator] = map[int][]string{}
		}
		shapes[r.Accelerator][r.AcceleratorCount] = append(shapes[r.Accelerator][r.AcceleratorCount], r.InstanceType)
	}
	all := []string{"n1-highmem-4", "n1-highmem-8", "n1-standard-16", "n1-standard-4", "n1-standard-8"}
	want := map[string]map[int][]string{"V100": {
		// One V100 allows at most 12 vCPUs: no n1-standard-16.
		1: {"n1-highmem-4", "n1-highmem-8", "n1-standard-4", "n1-standard-8"},
		2: all, 4: all, 8: all,
	}}
	if diff := cmp.Diff(want, shapes); diff != "" {
		t.Errorf("V100 shapes in us-central1-a (-want +got):\n%s", diff)
	}
}

func TestLookup(t *testing.T) {
	c := Default()
	for _, name := range []string{"A100", "a100"} {
		rows := c.Lookup(GCP, name)
		if len(rows) == 0 {
			t.Fatalf("Lookup(gcp, %q) found nothing", name)
		}
		for _, r := range rows {
			if r.Accelerator != "A100" {
				t.Errorf("Lookup(gcp, %q) returned %s", name, r.Accelerator)
			}
		}
	}
	cpu := c.Lookup(AWS, "")
	if len(cpu) != 54 {
		t.Errorf("AWS CPU-only rows = %d, want 54 (aws_cpu.csv)", len(cpu))
	}
	for _, r := range cpu {
		if r.Region != "us-east-1" || r.Zone != "" || r.SpotPerHour != 0 || r.OnDemandPerHour <= 0 {
			t.Errorf("AWS CPU row %+v: want us-east-1, no zone, on-demand price only", r)
		}
	}
	if rows := c.Lookup(GCP, "L4"); len(rows) != 17*8 {
		t.Errorf("GCP L4 rows = %d, want 136 (g2-standard only)", len(rows))
	}
	if rows := c.Lookup("azure", "A100"); rows != nil {
		t.Errorf("unknown cloud returned %d rows", len(rows))
	}
}

func TestMissingPricesStayMissing(t *testing.T) {
	p5e := find(t, AWS, "H200", 8, "p5e.48xlarge", "use2-az1")
	if _, ok := p5e.Price(false); ok {
		t.Error("p5e.48xlarge has an on-demand price; the catalog has none")
	}
	if p, ok := p5e.Price(true); !ok || p != 16.3895 {
		t.Errorf("p5e.48xlarge spot = %v, %v; want 16.3895", p, ok)
	}
	p4de := find(t, AWS, "A100-80GB", 8, "p4de.24xlarge", "use1-az1")
	if _, ok := p4de.Price(true); ok {
		t.Error("p4de.24xlarge in use1-az1 has a spot price; the catalog has none")
	}
}

func TestParseErrors(t *testing.T) {
	const header = "instance_type,accelerator,accelerator_count,vcpus,memory_gib,gpu_memory_mib,ondemand_usd_per_hour,spot_usd_per_hour,region,zone\n"
	okAWS := header + "g5.xlarge,A10G,1,4,16,22888,1.006,0.397,us-east-1,use1-az2\n"
	tests := map[string]struct {
		aws, gcp string
		wantErr  string
	}{
		"missing column": {
			aws: "instance_type,accelerator\ng5.xlarge,A10G\n", gcp: header,
			wantErr: "aws_gpu.csv: header lacks column(s) accelerator_count",
		},
		"bad price": {
			aws: header + "g5.xlarge,A10G,1,4,16,22888,cheap,,us-east-1,use1-az2\n", gcp: header,
			wantErr: `aws_gpu.csv:2: ondemand_usd_per_hour: "cheap" is not a non-negative number`,
		},
		"accelerator without count": {
			aws: okAWS, gcp: header + "a2-highgpu-1g,A100,0,12,85,40960,3.6,1.4,us-central1,us-central1-a\n",
			wantErr: "gcp_gpu.csv:2: accelerator and accelerator_count must be given together",
		},
		"attachment without limits": {
			aws: okAWS, gcp: header + "n1-attach-P4,P4,1,,,8192,0.6,0.2,us-central1,us-central1-a\n",
			wantErr: "no n1 attachment limits for P4:1",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := Parse(strings.NewReader(tc.aws), strings.NewReader(tc.gcp))
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("Parse error = %v, want it to contain %q", err, tc.wantErr)
			}
		})
	}
}

func TestParseComposesOnlyWithinAZone(t *testing.T) {
	const header = "instance_type,accelerator,accelerator_count,vcpus,memory_gib,gpu_memory_mib,ondemand_usd_per_hour,spot_usd_per_hour,region,zone\n"
	gcp := header +
		"n1-standard-4,,0,4,15,0,0.19,0.04815,us-central1,us-central1-a\n" +
		"n1-attach-T4,T4,1,,,16384,0.35,,us-central1,us-central1-a\n" +
		"n1-attach-T4,T4,1,,,16384,0.35,0.14,us-central1,us-central1-b\n"
	c, err := Parse(strings.NewReader(header), strings.NewReader(gcp))
	if err != nil {
		t.Fatal(err)
	}
	got := c.Lookup(GCP, "t4")
	want := []Row{{
		Cloud: GCP, InstanceType: "n1-standard-4", Accelerator: "T4", AcceleratorCount: 1,
		VCPUs: 4, MemoryGiB: 15, GPUMemoryMiB: 16384, OnDemandPerHour: 0.54, SpotPerHour: 0,
		Region: "us-central1", Zone: "us-central1-a",
	}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("composed rows (-want +got):\n%s", diff)
	}
}

// The CPU rows' vCPUs, memory and price are Karpenter's and AWS's published figures (see
// README.md); these are spot checks of the generated file against those sources.
func TestAWSCPUTypes(t *testing.T) {
	c := Default()
	want := map[string]Row{
		"m7i.large":    {Cloud: AWS, InstanceType: "m7i.large", VCPUs: 2, MemoryGiB: 8, OnDemandPerHour: 0.1008, Region: "us-east-1"},
		"c6i.xlarge":   {Cloud: AWS, InstanceType: "c6i.xlarge", VCPUs: 4, MemoryGiB: 8, OnDemandPerHour: 0.17, Region: "us-east-1"},
		"r7i.48xlarge": {Cloud: AWS, InstanceType: "r7i.48xlarge", VCPUs: 192, MemoryGiB: 1536, OnDemandPerHour: 12.7008, Region: "us-east-1"},
	}
	for name, w := range want {
		rows := c.InstanceType(name)
		if len(rows) != 1 {
			t.Fatalf("InstanceType(%q) = %d rows, want 1", name, len(rows))
		}
		if diff := cmp.Diff(w, rows[0]); diff != "" {
			t.Errorf("%s (-want +got):\n%s", name, diff)
		}
	}
	if c.InstanceType("m7i.metal-24xl") != nil {
		t.Error("metal sizes are not in the catalog (vCPUs not derivable from the name)")
	}
	if got := c.InstanceType("g5.xlarge"); len(got) == 0 || got[0].Accelerator != "A10G" {
		t.Errorf("InstanceType(g5.xlarge) = %v, want the A10G rows", got)
	}
	names := c.InstanceTypes()
	if !slices.IsSorted(names) || !slices.Contains(names, "a2-highgpu-1g") || !slices.Contains(names, "c7i.large") {
		t.Errorf("InstanceTypes: sorted %v, %d names", slices.IsSorted(names), len(names))
	}
}
