package optimizer

import (
	"cmp"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/ferryserve/ferry/launcher/catalog"
)

// WriteGPUs prints the cloud GPU instance types for `ferry show-gpus`, one section per cloud.
// As `sky show-gpus` does, each (GPU, count, instance type) appears once, from the zone with the
// lowest on-demand price (the lowest spot price where there is no on-demand price); both prices
// and REGION are that zone's. name, when not empty, keeps GPUs whose name contains it, ignoring
// case ("a100" lists A100 and A100-80GB).
func WriteGPUs(w io.Writer, rows []catalog.Row, name string) error {
	type key struct {
		cloud, accelerator, instanceType string
		count                            int
	}
	best := map[key]catalog.Row{}
	for _, r := range rows {
		if r.Accelerator == "" || !containsFold(r.Accelerator, name) {
			continue
		}
		k := key{r.Cloud, r.Accelerator, r.InstanceType, r.AcceleratorCount}
		if b, ok := best[k]; !ok || compareListing(r, b) < 0 {
			best[k] = r
		}
	}
	if len(best) == 0 {
		_, err := fmt.Fprintf(w, "no cloud GPU matches %q\n", name)
		return err
	}
	list := make([]catalog.Row, 0, len(best))
	for _, r := range best {
		list = append(list, r)
	}
	slices.SortFunc(list, func(a, b catalog.Row) int {
		if c := strings.Compare(a.Cloud, b.Cloud); c != 0 {
			return c
		}
		if c := strings.Compare(strings.ToLower(a.Accelerator), strings.ToLower(b.Accelerator)); c != 0 {
			return c
		}
		if c := cmp.Compare(a.AcceleratorCount, b.AcceleratorCount); c != 0 {
			return c
		}
		if c := compareListing(a, b); c != 0 {
			return c
		}
		return strings.Compare(a.InstanceType, b.InstanceType)
	})
	for start := 0; start < len(list); {
		end := start
		for end < len(list) && list[end].Cloud == list[start].Cloud {
			end++
		}
		if start > 0 {
			if _, err := io.WriteString(w, "\n"); err != nil {
				return err
			}
		}
		t := newTable("GPU", "QTY", "INFRA", "INSTANCE_TYPE", "DEVICE_MEM", "vCPUs", "HOST_MEM", "HOURLY_PRICE", "HOURLY_SPOT_PRICE", "REGION")
		for _, r := range list[start:end] {
			od, _ := r.Price(false)
			spot, _ := r.Price(true)
			t.row(r.Accelerator, strconv.Itoa(r.AcceleratorCount), r.Cloud, r.InstanceType,
				deviceMemory(r), formatNumber(r.VCPUs), formatNumber(r.MemoryGiB)+"GB",
				dollars(od), dollars(spot), r.Region)
		}
		if err := t.flush(w); err != nil {
			return err
		}
		start = end
	}
	return nil
}

// compareListing orders rows of one instance type by on-demand price, then spot price (a
// missing price last), then location.
func compareListing(a, b catalog.Row) int {
	if c := cmp.Compare(priceOrInf(a, false), priceOrInf(b, false)); c != 0 {
		return c
	}
	if c := cmp.Compare(priceOrInf(a, true), priceOrInf(b, true)); c != 0 {
		return c
	}
	if c := strings.Compare(a.Region, b.Region); c != 0 {
		return c
	}
	return strings.Compare(a.Zone, b.Zone)
}

func priceOrInf(r catalog.Row, spot bool) float64 {
	if p, ok := r.Price(spot); ok {
		return p
	}
	return math.Inf(1)
}

func dollars(p float64) string {
	if p == 0 {
		return "-"
	}
	return fmt.Sprintf("$ %.3f", p)
}

// deviceMemory is one GPU's memory, rounded to whole GB as `sky show-gpus` prints it.
func deviceMemory(r catalog.Row) string {
	if r.GPUMemoryMiB == 0 || r.AcceleratorCount == 0 {
		return "-"
	}
	return strconv.Itoa(int(math.Round(float64(r.GPUMemoryMiB)/float64(r.AcceleratorCount)/1024))) + "GB"
}

func containsFold(s, sub string) bool {
	return sub == "" || strings.Contains(strings.ToLower(s), strings.ToLower(sub))
}

// WriteKubernetesGPUs prints the GPUs the Kubernetes infras' nodes carry: the counts one pod
// may request on a node (powers of two up to the largest node's count, and that count), and
// the total and free GPUs across the cluster ("-" where the cluster did not say). name filters
// as in WriteGPUs.
func WriteKubernetesGPUs(w io.Writer, infras []Infra, name string) error {
	t := newTable("GPU", "REQUESTABLE_QTY_PER_NODE", "TOTAL", "FREE", "INFRA")
	n := 0
	for _, inf := range infras {
		if inf.Kind != Kubernetes {
			continue
		}
		for _, o := range inf.Offerings {
			if o.Accelerator == "" || !containsFold(o.Accelerator, name) {
				continue
			}
			t.row(o.Accelerator, requestable(o.AcceleratorCount), count(o.Total), count(o.Free), inf.Name)
			n++
		}
	}
	if n == 0 {
		msg := "no Kubernetes GPU"
		if name != "" {
			msg += fmt.Sprintf(" matches %q", name)
		}
		_, err := io.WriteString(w, msg+"\n")
		return err
	}
	return t.flush(w)
}

// requestable lists 1, 2, 4, ... up to most, and most itself: "1, 2, 4, 6".
func requestable(most float64) string {
	if most < 1 {
		return formatNumber(most)
	}
	var parts []string
	for q := 1.0; q < most; q *= 2 {
		parts = append(parts, formatNumber(q))
	}
	return strings.Join(append(parts, formatNumber(most)), ", ")
}

func count(n int) string {
	if n < 0 {
		return "-"
	}
	return strconv.Itoa(n)
}
