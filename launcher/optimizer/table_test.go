package optimizer

import (
	"bytes"
	"os"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/catalog"
)

// A spot A100 anywhere, with a Kubernetes cluster that has A100 nodes: the cluster comes first
// at no cost, then GCP's spot a2-highgpu-1g zones (AWS has no single-A100 instance type).
func ExampleWriteTable() {
	r := configs.Resources{Infra: "*", UseSpot: true, Accelerators: []configs.Accelerator{{Name: "A100", Count: 1}}}
	cands, err := Plan(r, []Infra{
		{Name: "kubernetes/lab", Kind: Kubernetes, Offerings: []launcher.Offering{{Accelerator: "A100", AcceleratorCount: 8, Total: 16, Free: 10}}},
		{Name: "aws", Kind: Cloud},
		{Name: "gcp", Kind: Cloud},
	})
	if err != nil {
		panic(err)
	}
	WriteTable(os.Stdout, cands, 0, 6)
	// Output:
	// INFRA           INSTANCE             vCPUs  Mem(GB)  GPUS    REGION/ZONE                COST ($/hr)  CHOSEN
	// kubernetes/lab  -                    -      -        A100:1  -                          $ 0.00       ✔
	// gcp             a2-highgpu-1g[Spot]  12     85       A100:1  us-central1/us-central1-a  $ 1.44
	// gcp             a2-highgpu-1g[Spot]  12     85       A100:1  us-central1/us-central1-b  $ 1.44
	// gcp             a2-highgpu-1g[Spot]  12     85       A100:1  us-central1/us-central1-c  $ 1.44
	// gcp             a2-highgpu-1g[Spot]  12     85       A100:1  us-central1/us-central1-f  $ 1.44
	// gcp             a2-highgpu-1g[Spot]  12     85       A100:1  us-east1/us-east1-b        $ 1.44
	// ... and 3 more (gcp 3)
}

// ordered alternatives: every candidate of the first (GCP L4) comes before any of the second
// (AWS A10G), whatever their prices. Narrowed to one region each and 4 vCPUs to keep it short.
func ExampleWriteTable_ordered() {
	r := configs.Resources{CPUs: "4", Ordered: []configs.Resources{
		{Infra: "gcp/us-east4", CPUs: "4", Accelerators: []configs.Accelerator{{Name: "L4", Count: 1}}},
		{Infra: "aws/us-east-2", CPUs: "4", Accelerators: []configs.Accelerator{{Name: "A10G", Count: 1}}},
	}}
	cands, err := Plan(r, []Infra{{Name: "aws", Kind: Cloud}, {Name: "gcp", Kind: Cloud}})
	if err != nil {
		panic(err)
	}
	WriteTable(os.Stdout, cands, 0, 0)
	// Output:
	// INFRA  INSTANCE       vCPUs  Mem(GB)  GPUS    REGION/ZONE          COST ($/hr)  CHOSEN
	// gcp    g2-standard-4  4      16       L4:1    us-east4/us-east4-a  $ 0.70       ✔
	// gcp    g2-standard-4  4      16       L4:1    us-east4/us-east4-c  $ 0.70
	// aws    g5.xlarge      4      16       A10G:1  us-east-2/use2-az1   $ 1.01
	// aws    g5.xlarge      4      16       A10G:1  us-east-2/use2-az2   $ 1.01
	// aws    g5.xlarge      4      16       A10G:1  us-east-2/use2-az3   $ 1.01
}

func TestWriteTableShowsChosenBeyondLimit(t *testing.T) {
	cands := []Candidate{
		{Placement: launcher.Placement{Infra: "kubernetes/lab", Accelerator: "A100", AcceleratorCount: 0.5}},
		{Placement: launcher.Placement{Infra: "local", VCPUs: 2}},
		{Placement: launcher.Placement{Infra: "aws", Region: "us-east-2", Zone: "us-east-2a", InstanceType: "g5.xlarge",
			Accelerator: "A10G", AcceleratorCount: 1, VCPUs: 4, MemoryGiB: 16, Spot: true, PricePerHour: 0.3733}},
		{Placement: launcher.Placement{Infra: "gcp", Region: "us-central1", InstanceType: "n1-standard-8", VCPUs: 8, MemoryGiB: 30, PricePerHour: 12.345}},
	}
	var buf bytes.Buffer
	if err := WriteTable(&buf, cands, 2, 1); err != nil {
		t.Fatal(err)
	}
	want := "" +
		"INFRA           INSTANCE         vCPUs  Mem(GB)  GPUS      REGION/ZONE           COST ($/hr)  CHOSEN\n" +
		"kubernetes/lab  -                -      -        A100:0.5  -                     $ 0.00\n" +
		"aws             g5.xlarge[Spot]  4      16       A10G:1    us-east-2/us-east-2a  $ 0.37       ✔\n" +
		"... and 2 more (local 1, gcp 1)\n"
	if diff := cmp.Diff(want, buf.String()); diff != "" {
		t.Errorf("table (-want +got):\n%s", diff)
	}

	buf.Reset()
	if err := WriteTable(&buf, cands, -1, 0); err != nil {
		t.Fatal(err)
	}
	want = "" +
		"INFRA           INSTANCE         vCPUs  Mem(GB)  GPUS      REGION/ZONE           COST ($/hr)  CHOSEN\n" +
		"kubernetes/lab  -                -      -        A100:0.5  -                     $ 0.00\n" +
		"local           -                2      -        -         -                     $ 0.00\n" +
		"aws             g5.xlarge[Spot]  4      16       A10G:1    us-east-2/us-east-2a  $ 0.37\n" +
		"gcp             n1-standard-8    8      30       -         us-central1           $ 12.35\n"
	if diff := cmp.Diff(want, buf.String()); diff != "" {
		t.Errorf("table without limit or choice (-want +got):\n%s", diff)
	}
}

func TestWriteGPUs(t *testing.T) {
	const header = "GPU   QTY  INFRA  INSTANCE_TYPE  DEVICE_MEM  vCPUs  HOST_MEM  HOURLY_PRICE  HOURLY_SPOT_PRICE  REGION\n"
	tests := map[string]struct {
		filter string
		want   string
	}{
		// p5.48xlarge costs the same on-demand in every US region: the cheaper spot price picks
		// us-east-2. GCP H100 is cheapest on-demand in us-central1 (catalog problem 4). The
		// filter is a substring, so H100-MEGA is listed too.
		"h100": {filter: "h100", want: header +
			"H100  8    aws    p5.48xlarge    80GB        192    2048GB    $ 98.320      $ 14.377           us-east-2\n" +
			"\n" +
			"GPU        QTY  INFRA  INSTANCE_TYPE  DEVICE_MEM  vCPUs  HOST_MEM  HOURLY_PRICE  HOURLY_SPOT_PRICE  REGION\n" +
			"H100       1    gcp    a3-highgpu-1g  80GB        26     234GB     $ 5.383       $ 2.525            us-central1\n" +
			"H100       2    gcp    a3-highgpu-2g  80GB        52     468GB     $ 10.767      $ 5.050            us-central1\n" +
			"H100       4    gcp    a3-highgpu-4g  80GB        104    936GB     $ 21.533      $ 10.100           us-central1\n" +
			"H100       8    gcp    a3-highgpu-8g  80GB        208    1872GB    $ 43.066      $ 20.199           us-central1\n" +
			"H100-MEGA  8    gcp    a3-megagpu-8g  80GB        208    1872GB    $ 92.214      $ 21.208           us-central1\n",
		},
		// p5e.48xlarge has no on-demand price: it sorts last and its row is the cheapest spot one.
		"H200": {filter: "H200", want: header +
			"H200  8    aws    p5en.48xlarge  141GB       192    2048GB    $ 84.800      $ 15.492           us-east-2\n" +
			"H200  8    aws    p5e.48xlarge   141GB       192    2048GB    -             $ 14.466           us-east-2\n" +
			"\n" +
			"GPU   QTY  INFRA  INSTANCE_TYPE   DEVICE_MEM  vCPUs  HOST_MEM  HOURLY_PRICE  HOURLY_SPOT_PRICE  REGION\n" +
			"H200  8    gcp    a3-ultragpu-8g  141GB       224    2952GB    $ 49.482      $ 33.607           europe-west4\n",
		},
		"no match": {filter: "B200", want: "no cloud GPU matches \"B200\"\n"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var buf bytes.Buffer
			if err := WriteGPUs(&buf, catalog.Default().Rows(), tc.filter); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, buf.String()); diff != "" {
				t.Errorf("show-gpus %s (-want +got):\n%s", tc.filter, diff)
			}
		})
	}

	// Unfiltered, every accelerator of the catalog appears, CPU-only rows do not.
	var buf bytes.Buffer
	if err := WriteGPUs(&buf, catalog.Default().Rows(), ""); err != nil {
		t.Fatal(err)
	}
	for _, gpu := range []string{"T4 ", "A10G ", "L4 ", "L40S ", "V100 ", "V100-32GB ", "P100 ", "A100-80GB ", "H100-MEGA ", "H200 "} {
		if !bytes.Contains(buf.Bytes(), []byte("\n"+gpu)) {
			t.Errorf("unfiltered listing lacks %s", gpu)
		}
	}
	if bytes.Contains(buf.Bytes(), []byte("\n ")) {
		t.Error("unfiltered listing has a row without a GPU")
	}
}

func TestWriteKubernetesGPUs(t *testing.T) {
	infras := []Infra{
		{Name: "aws", Kind: Cloud},
		{Name: "kubernetes/lab", Kind: Kubernetes, Offerings: []launcher.Offering{
			{VCPUs: 96, Total: -1, Free: -1},
			{Accelerator: "A100", AcceleratorCount: 8, Total: 16, Free: 10},
			{Accelerator: "L4", AcceleratorCount: 6, Total: 12, Free: -1},
		}},
		{Name: "kubernetes/edge", Kind: Kubernetes, Offerings: []launcher.Offering{
			{Accelerator: "T4", AcceleratorCount: 1, Total: 3, Free: 0},
		}},
	}
	var buf bytes.Buffer
	if err := WriteKubernetesGPUs(&buf, infras, ""); err != nil {
		t.Fatal(err)
	}
	want := "" +
		"GPU   REQUESTABLE_QTY_PER_NODE  TOTAL  FREE  INFRA\n" +
		"A100  1, 2, 4, 8                16     10    kubernetes/lab\n" +
		"L4    1, 2, 4, 6                12     -     kubernetes/lab\n" +
		"T4    1                         3      0     kubernetes/edge\n"
	if diff := cmp.Diff(want, buf.String()); diff != "" {
		t.Errorf("kubernetes GPUs (-want +got):\n%s", diff)
	}

	buf.Reset()
	if err := WriteKubernetesGPUs(&buf, infras, "h100"); err != nil {
		t.Fatal(err)
	}
	if got, want := buf.String(), "no Kubernetes GPU matches \"h100\"\n"; got != want {
		t.Errorf("filtered = %q, want %q", got, want)
	}
}
