package sim

import (
	"bufio"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
)

// CatalogRow is one instance type in one zone of the price catalog (../shared/data/catalog).
type CatalogRow struct {
	InstanceType string
	Region       string
	// Zone is the AWS Availability Zone ID (use1-az4), not an account's zone name.
	Zone string
	// AcceleratorCount is the row's GPUs (GCP's attachment rows come in 1, 2, 4 and 8).
	AcceleratorCount int
	// OnDemand and Spot are $/hour; 0 where the catalog has no price.
	OnDemand, Spot float64
}

// LoadCatalog reads a catalog CSV (aws_gpu.csv's columns; extra columns are ignored).
func LoadCatalog(path string) ([]CatalogRow, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("catalog: %w", err)
	}
	defer f.Close()
	rows, err := ParseCatalog(bufio.NewReader(f))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return rows, nil
}

// ParseCatalog parses the CSV and names the line of the first bad row.
func ParseCatalog(r io.Reader) ([]CatalogRow, error) {
	cr := csv.NewReader(r)
	header, err := cr.Read()
	if errors.Is(err, io.EOF) {
		return nil, errors.New("empty file: want a header line")
	}
	if err != nil {
		return nil, fmt.Errorf("header: %w", err)
	}
	col := map[string]int{}
	for i, h := range header {
		col[strings.TrimSpace(h)] = i
	}
	need := []string{"instance_type", "ondemand_usd_per_hour", "spot_usd_per_hour", "region", "zone"}
	for _, n := range need {
		if _, ok := col[n]; !ok {
			return nil, fmt.Errorf("line 1: header has no %q column (want %s)", n, strings.Join(need, ", "))
		}
	}
	price := func(line int, rec []string, name string) (float64, error) {
		s := strings.TrimSpace(rec[col[name]])
		if s == "" {
			return 0, nil
		}
		v, err := strconv.ParseFloat(s, 64)
		if err != nil || v <= 0 {
			return 0, fmt.Errorf("line %d: %s %q: want a positive number or empty", line, name, s)
		}
		return v, nil
	}
	var out []CatalogRow
	for {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		line, _ := cr.FieldPos(0)
		od, err := price(line, rec, "ondemand_usd_per_hour")
		if err != nil {
			return nil, err
		}
		spot, err := price(line, rec, "spot_usd_per_hour")
		if err != nil {
			return nil, err
		}
		count := 0
		if i, ok := col["accelerator_count"]; ok {
			count, _ = strconv.Atoi(strings.TrimSpace(rec[i]))
		}
		out = append(out, CatalogRow{
			AcceleratorCount: count,
			InstanceType:     strings.TrimSpace(rec[col["instance_type"]]),
			Region:           strings.TrimSpace(rec[col["region"]]),
			Zone:             strings.TrimSpace(rec[col["zone"]]),
			OnDemand:         od,
			Spot:             spot,
		})
	}
}

// Zone is a zone spot replicas can be placed in: its availability trace and its price.
type Zone struct {
	// Name is the trace's zone name (us-east-1a, us-central1-a) and Region its region.
	Name, Region string
	Provider     Provider
	// AZID is the catalog row the price came from (use1-az1; for GCP, whose spot prices are
	// regional, the region).
	AZID string
	// SpotPrice is $/hour for one replica on spot capacity here.
	SpotPrice float64
	// PriceNote says where SpotPrice came from when not from the zone's own row.
	PriceNote string
	Trace     *SpotTrace
}

// Prices is the outcome of matching spot traces with the catalog.
type Prices struct {
	// Source is the spot set the zones came from.
	Source       string
	InstanceType string
	Zones        []Zone
	// OnDemand is $/hour for an on-demand replica: the lowest on-demand price of the
	// instance type over the zones' regions (on-demand capacity is taken as always there).
	OnDemand float64
	// Notes are the mapping's decisions worth printing (median prices, dropped zones).
	Notes []string
}

// MatchZones pairs each trace zone with the catalog's price for instanceType.
//
// The traces name zones as an account sees them (us-east-1a); the catalog keys prices by AZ ID
// (use1-az1), and which name is which ID differs between AWS accounts. Nothing in the data says
// which account collected the traces, so the mapping is positional and deterministic: zone
// letter k of a region (a = 1, b = 2, ...) is AZ ID az<k> of that region (us-east-1a → use1-az1,
// us-east-2b → use2-az2). In the three regions used here the letters and IDs are in one-to-one
// correspondence (us-east-1: a–f and az1–az6; us-east-2: a–c and az1–az3; us-west-2: a–d and
// az1–az4), so no two trace zones share a price row. The choice only decides which
// availability trace goes with which spot price; the on-demand price is the same in every zone.
//
// A zone whose row has no spot price gets the median spot price of the instance type over its
// region's zones that have one (and a note says so). A zone with no row at all is dropped, with
// a note.
func MatchZones(rows []CatalogRow, instanceType string, traces []*SpotTrace) (*Prices, error) {
	p := &Prices{InstanceType: instanceType}
	byAZ := map[string]CatalogRow{}
	regionSpot := map[string][]float64{}
	for _, r := range rows {
		if r.InstanceType != instanceType {
			continue
		}
		byAZ[r.Zone] = r
		if r.Spot > 0 {
			regionSpot[r.Region] = append(regionSpot[r.Region], r.Spot)
		}
	}
	if len(byAZ) == 0 {
		return nil, fmt.Errorf("catalog has no row for instance type %q", instanceType)
	}
	for _, tr := range traces {
		region, letter, ok := splitZoneName(tr.Zone)
		if !ok {
			return nil, fmt.Errorf("spot trace zone %q: want a zone name like us-east-1a", tr.Zone)
		}
		azid := ""
		for id, r := range byAZ {
			if r.Region == region && strings.HasSuffix(id, fmt.Sprintf("-az%d", letter-'a'+1)) {
				azid = id
			}
		}
		if azid == "" {
			p.Notes = append(p.Notes, fmt.Sprintf("%s dropped: the catalog has no %s row for AZ az%d of %s", tr.Zone, instanceType, letter-'a'+1, region))
			continue
		}
		row := byAZ[azid]
		z := Zone{Name: tr.Zone, Region: region, Provider: AWS, AZID: azid, SpotPrice: row.Spot, Trace: tr}
		if z.SpotPrice == 0 {
			prices := regionSpot[region]
			if len(prices) == 0 {
				p.Notes = append(p.Notes, fmt.Sprintf("%s dropped: no %s spot price anywhere in %s", tr.Zone, instanceType, region))
				continue
			}
			z.SpotPrice = median(prices)
			z.PriceNote = fmt.Sprintf("median of %s's %d spot prices (%s has none)", region, len(prices), azid)
			p.Notes = append(p.Notes, fmt.Sprintf("%s (%s): no spot price in the catalog, using %s's median %.4f", tr.Zone, azid, region, z.SpotPrice))
		}
		if row.OnDemand > 0 && (p.OnDemand == 0 || row.OnDemand < p.OnDemand) {
			p.OnDemand = row.OnDemand
		}
		p.Zones = append(p.Zones, z)
	}
	if len(p.Zones) == 0 {
		return nil, fmt.Errorf("no spot trace zone matched a %s catalog row", instanceType)
	}
	if p.OnDemand == 0 {
		return nil, fmt.Errorf("catalog has no on-demand price for %s in the traces' regions", instanceType)
	}
	return p, nil
}

// splitZoneName splits an AWS zone name, us-east-1a, into us-east-1 and 'a'.
func splitZoneName(name string) (region string, letter byte, ok bool) {
	p, region, letter, ok := ParseZone(name)
	return region, letter, ok && p == AWS
}

// MatchGCPZones prices each GCP trace zone with its region's catalog rows for machine, a
// machine type or machine+attachment (n1-standard-8+n1-attach-V100: an n1 host with one V100
// attached, priced as host row + one-GPU row, as GCP bills it). GCP's spot prices are the
// same in every zone of a region, so a zone takes its region's price even where the catalog
// lists the part in another zone of the region only (us-east1's V100 rows are us-east1-c's).
// A zone whose region lacks a part is dropped, with a note.
func MatchGCPZones(rows []CatalogRow, machine string, traces []*SpotTrace) (*Prices, error) {
	parts := strings.Split(machine, "+")
	type price struct{ od, spot float64 }
	regional := map[string]map[string]price{} // part → region → price
	for _, r := range rows {
		if !slices.Contains(parts, r.InstanceType) || (strings.Contains(r.InstanceType, "-attach-") && r.AcceleratorCount != 1) {
			continue
		}
		if regional[r.InstanceType] == nil {
			regional[r.InstanceType] = map[string]price{}
		}
		if _, ok := regional[r.InstanceType][r.Region]; !ok {
			regional[r.InstanceType][r.Region] = price{r.OnDemand, r.Spot}
		}
	}
	for _, part := range parts {
		if len(regional[part]) == 0 {
			return nil, fmt.Errorf("catalog has no row for GCP %q (of %s)", part, machine)
		}
	}
	p := &Prices{InstanceType: machine}
	for _, tr := range traces {
		_, region, _, _ := ParseZone(tr.Zone)
		var sum price
		missing := ""
		for _, part := range parts {
			pr, ok := regional[part][region]
			if !ok || pr.od == 0 || pr.spot == 0 {
				missing = part
				break
			}
			sum.od += pr.od
			sum.spot += pr.spot
		}
		if missing != "" {
			p.Notes = append(p.Notes, fmt.Sprintf("%s dropped: the catalog has no %s on-demand and spot price in %s", tr.Zone, missing, region))
			continue
		}
		if p.OnDemand == 0 || sum.od < p.OnDemand {
			p.OnDemand = sum.od
		}
		p.Zones = append(p.Zones, Zone{Name: tr.Zone, Region: region, Provider: GCP, AZID: region, SpotPrice: sum.spot, Trace: tr})
	}
	if len(p.Zones) == 0 {
		return nil, fmt.Errorf("no spot trace zone matched a %s catalog row", machine)
	}
	return p, nil
}

// median of a non-empty slice.
func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}
