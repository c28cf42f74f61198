// Package catalog is the price list the optimizer reads: GPU instance types on AWS and GCP with
// their on-demand and spot prices per zone (copied from SkyPilot's catalog), AWS CPU instance
// types with on-demand prices per region (from Karpenter's price table), and what each
// accelerator does per hour (throughput.go). The data is embedded in the binary, so planning a launch needs no network and gives the same answer on
// every machine. README.md records where the numbers come from and what is wrong with them.
package catalog

import (
	"bytes"
	_ "embed"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// Cloud names as infra strings spell them ("aws/us-east-1").
const (
	AWS = "aws"
	GCP = "gcp"
)

//go:embed data/aws_gpu.csv
var awsCSV []byte

//go:embed data/gcp_gpu.csv
var gcpCSV []byte

//go:embed data/aws_cpu.csv
var awsCPUCSV []byte

// Row is one instance type in one zone with its prices: a complete VM, ready to launch. GCP
// host-plus-GPU pairs (n1 with T4, V100, P100) are already composed into one row.
type Row struct {
	Cloud        string
	InstanceType string
	// Accelerator is the catalog's GPU name (A100, L4, H100-MEGA, ...); "" for a CPU-only VM.
	Accelerator      string
	AcceleratorCount int
	VCPUs            float64
	MemoryGiB        float64
	// GPUMemoryMiB is the total over all the row's GPUs.
	GPUMemoryMiB int
	// OnDemandPerHour and SpotPerHour are USD per hour, 0 where the catalog has no price (no
	// real price is 0, so 0 can only mean missing). Use Price to read them.
	OnDemandPerHour float64
	SpotPerHour     float64
	Region          string
	// Zone is an AWS Availability Zone ID (use1-az4, the same physical zone in every account)
	// or a GCP zone name (us-central1-a); "" for a row priced per region (AWS CPU types),
	// which any zone of the region may take.
	Zone string
}

// Price returns the row's hourly price for the pricing model, and false when the catalog has
// none: a row without a spot price is not a spot candidate, and likewise for on-demand.
func (r Row) Price(spot bool) (float64, bool) {
	p := r.OnDemandPerHour
	if spot {
		p = r.SpotPerHour
	}
	return p, p > 0
}

// Catalog is a parsed, immutable price list, safe for concurrent use.
type Catalog struct {
	rows   []Row
	groups []group
	// types maps an instance type to its rows (in Rows order); names lists them sorted.
	types map[string][]Row
	names []string
}

// group is the run of rows that share a cloud and an accelerator name.
type group struct {
	cloud, accelerator string
	rows               []Row
}

var defaultCatalog = sync.OnceValue(func() *Catalog {
	c, err := Parse(bytes.NewReader(awsCSV), bytes.NewReader(gcpCSV), bytes.NewReader(awsCPUCSV))
	if err != nil {
		// The data is compiled in and a test parses it; failing here is a build defect.
		panic("catalog: embedded data is malformed: " + err.Error())
	}
	return c
})

// Default returns the embedded catalog, parsed on first use.
func Default() *Catalog { return defaultCatalog() }

// Parse reads an AWS and a GCP catalog file in the format of data/*.csv (columns found by
// header name), and any more AWS files (the CPU types), composes GCP n1 host rows with their
// GPU attachments, and indexes the result.
func Parse(aws, gcp io.Reader, moreAWS ...io.Reader) (*Catalog, error) {
	awsRows, err := parseFile(AWS, "aws_gpu.csv", aws)
	if err != nil {
		return nil, err
	}
	for i, r := range moreAWS {
		more, err := parseFile(AWS, fmt.Sprintf("aws file %d", i+2), r)
		if err != nil {
			return nil, err
		}
		awsRows = append(awsRows, more...)
	}
	gcpRows, err := parseFile(GCP, "gcp_gpu.csv", gcp)
	if err != nil {
		return nil, err
	}
	gcpRows, err = composeGCP(gcpRows)
	if err != nil {
		return nil, err
	}
	rows := slices.Concat(awsRows, gcpRows)
	slices.SortFunc(rows, compareRows)
	c := &Catalog{rows: rows}
	for start := 0; start < len(rows); {
		end := start + 1
		for end < len(rows) && rows[end].Cloud == rows[start].Cloud && strings.EqualFold(rows[end].Accelerator, rows[start].Accelerator) {
			end++
		}
		c.groups = append(c.groups, group{cloud: rows[start].Cloud, accelerator: rows[start].Accelerator, rows: rows[start:end:end]})
		start = end
	}
	c.types = map[string][]Row{}
	for _, r := range rows {
		if c.types[r.InstanceType] == nil {
			c.names = append(c.names, r.InstanceType)
		}
		c.types[r.InstanceType] = append(c.types[r.InstanceType], r)
	}
	slices.Sort(c.names)
	return c, nil
}

// InstanceType returns the rows of one instance type (every cloud, region and zone that has
// it), matched exactly; nil when the catalog has no such type.
func (c *Catalog) InstanceType(name string) []Row { return c.types[name] }

// InstanceTypes returns every instance type name, sorted. The slice is shared.
func (c *Catalog) InstanceTypes() []string { return c.names }

// compareRows orders by cloud, accelerator (ignoring case), count, instance type, region, zone:
// rows that differ only in location sit together, which the optimizer relies on.
func compareRows(a, b Row) int {
	if c := strings.Compare(a.Cloud, b.Cloud); c != 0 {
		return c
	}
	if c := strings.Compare(strings.ToLower(a.Accelerator), strings.ToLower(b.Accelerator)); c != 0 {
		return c
	}
	if c := a.AcceleratorCount - b.AcceleratorCount; c != 0 {
		return c
	}
	if c := strings.Compare(a.InstanceType, b.InstanceType); c != 0 {
		return c
	}
	if c := strings.Compare(a.Region, b.Region); c != 0 {
		return c
	}
	return strings.Compare(a.Zone, b.Zone)
}

// Rows returns every row, ordered by cloud, accelerator, count, instance type, region and zone.
// The slice is shared: callers must not modify it.
func (c *Catalog) Rows() []Row { return c.rows }

// Lookup returns the rows of one cloud with the named accelerator, matched ignoring case
// ("a100" finds A100 but not A100-80GB); "" finds the CPU-only rows. The slice is shared and
// ordered as Rows; callers must not modify it.
func (c *Catalog) Lookup(cloud, accelerator string) []Row {
	for _, g := range c.groups {
		if g.cloud == cloud && strings.EqualFold(g.accelerator, accelerator) {
			return g.rows
		}
	}
	return nil
}

// columns are the header names a catalog file must have.
var columns = []string{"instance_type", "accelerator", "accelerator_count", "vcpus", "memory_gib",
	"gpu_memory_mib", "ondemand_usd_per_hour", "spot_usd_per_hour", "region", "zone"}

func parseFile(cloud, name string, r io.Reader) ([]Row, error) {
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = -1
	records, err := cr.ReadAll()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if len(records) == 0 {
		return nil, fmt.Errorf("%s: empty file", name)
	}
	col := map[string]int{}
	for i, h := range records[0] {
		col[strings.TrimSpace(h)] = i
	}
	var missing []string
	for _, c := range columns {
		if _, ok := col[c]; !ok {
			missing = append(missing, c)
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("%s: header lacks column(s) %s", name, strings.Join(missing, ", "))
	}
	rows := make([]Row, 0, len(records)-1)
	for i, rec := range records[1:] {
		line := i + 2
		if len(rec) != len(records[0]) {
			return nil, fmt.Errorf("%s:%d: %d fields, header has %d", name, line, len(rec), len(records[0]))
		}
		p := fieldParser{rec: rec, col: col}
		row := Row{
			Cloud:            cloud,
			InstanceType:     p.text("instance_type"),
			Accelerator:      p.text("accelerator"),
			AcceleratorCount: int(p.number("accelerator_count", true)),
			VCPUs:            p.number("vcpus", false),
			MemoryGiB:        p.number("memory_gib", false),
			GPUMemoryMiB:     int(p.number("gpu_memory_mib", false)),
			OnDemandPerHour:  p.number("ondemand_usd_per_hour", false),
			SpotPerHour:      p.number("spot_usd_per_hour", false),
			Region:           p.text("region"),
			Zone:             p.text("zone"),
		}
		switch {
		case p.err != nil:
		case row.InstanceType == "" || row.Region == "":
			p.err = errors.New("instance_type and region are required")
		case (row.Accelerator == "") != (row.AcceleratorCount == 0):
			p.err = errors.New("accelerator and accelerator_count must be given together")
		}
		if p.err != nil {
			return nil, fmt.Errorf("%s:%d: %w", name, line, p.err)
		}
		rows = append(rows, row)
	}
	return rows, nil
}

// fieldParser reads one record's fields by column name and keeps the first error.
type fieldParser struct {
	rec []string
	col map[string]int
	err error
}

func (p *fieldParser) text(name string) string { return strings.TrimSpace(p.rec[p.col[name]]) }

// number parses a non-negative number; an empty field is 0 unless required.
func (p *fieldParser) number(name string, required bool) float64 {
	s := p.text(name)
	if s == "" && !required {
		return 0
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || v < 0 || math.IsInf(v, 0) || math.IsNaN(v) {
		if p.err == nil {
			p.err = fmt.Errorf("%s: %q is not a non-negative number", name, s)
		}
		return 0
	}
	return v
}
