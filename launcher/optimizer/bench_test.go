package optimizer

import (
	"io"
	"testing"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher/catalog"
)

// BenchmarkPlan plans requests a serving user writes, against one Kubernetes context and both
// clouds. The catalog is parsed before timing starts (it is parsed once per process).
func BenchmarkPlan(b *testing.B) {
	infras := []Infra{lab, cpuOnlyCluster, aws, gcp, local}
	cases := map[string]configs.Resources{
		"spot A100 or L4 anywhere": {Infra: "*", UseSpot: true, CPUs: "8+", Accelerators: accs(b, "A100:1", "L4:1")},
		"ordered gcp L4 then aws A10G": {Ordered: []configs.Resources{
			{Infra: "gcp", Accelerators: accs(b, "L4:1")},
			{Infra: "aws", Accelerators: accs(b, "A10G:1")},
		}},
		"any_of across three GPUs": {UseSpot: true, AnyOf: []configs.Resources{
			{Infra: "*", UseSpot: true, Accelerators: accs(b, "H100:8")},
			{Infra: "aws/us-east-1", UseSpot: true, Accelerators: accs(b, "A100:8")},
			{Infra: "gcp", UseSpot: true, Accelerators: accs(b, "A100-80GB:8")},
		}},
	}
	catalog.Default()
	for name, r := range cases {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			n := 0
			for b.Loop() {
				cands, err := Plan(r, infras)
				if err != nil {
					b.Fatal(err)
				}
				n = len(cands)
			}
			b.ReportMetric(float64(n), "candidates")
		})
	}
}

// BenchmarkPlanNoCandidate measures the failure path, which also builds the explanation.
func BenchmarkPlanNoCandidate(b *testing.B) {
	infras := []Infra{cpuOnlyCluster, aws, gcp}
	r := configs.Resources{Infra: "*", Accelerators: accs(b, "A100:3")}
	catalog.Default()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Plan(r, infras); err == nil {
			b.Fatal("planned A100:3")
		}
	}
}

func BenchmarkWriteTable(b *testing.B) {
	cands, err := Plan(configs.Resources{Infra: "*", UseSpot: true, Accelerators: accs(b, "L4:1", "A10G:1")}, []Infra{lab, aws, gcp})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := WriteTable(io.Discard, cands, 0, 10); err != nil {
			b.Fatal(err)
		}
	}
}
