package fakeec2

import (
	"encoding/xml"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Namespace is the XML namespace of EC2 API version 2016-11-15, the one the SDK speaks.
const Namespace = "http://ec2.amazonaws.com/doc/2016-11-15/"

// APIError is an EC2 error as the Query API returns it: a code the SDK exposes through
// smithy.APIError, a message, and the HTTP status EC2 sends with it.
type APIError struct {
	Code    string
	Message string
	Status  int
}

func (e *APIError) Error() string { return e.Code + ": " + e.Message }

// apiErr builds an APIError with the status EC2 uses for code.
func apiErr(code, format string, args ...any) *APIError {
	msg := format
	if len(args) > 0 {
		msg = sprintf(format, args...)
	}
	return &APIError{Code: code, Message: msg, Status: StatusFor(code)}
}

// StatusFor is the HTTP status EC2 answers code with: 401 for bad credentials, 403 for a
// denied action, 500 for server-side capacity and internal errors (which the SDK's default
// retryer retries), 503 for throttling-like unavailability, 400 for the rest.
func StatusFor(code string) int {
	switch code {
	case "AuthFailure", "MissingAuthenticationToken":
		return http.StatusUnauthorized
	case "UnauthorizedOperation", "OptInRequired", "Blocked":
		return http.StatusForbidden
	case "InsufficientInstanceCapacity", "InsufficientCapacity", "InternalError", "InternalFailure", "InsufficientHostCapacity":
		return http.StatusInternalServerError
	case "Unavailable", "ServiceUnavailable", "RequestLimitExceeded":
		return http.StatusServiceUnavailable
	}
	return http.StatusBadRequest
}

// errorResponse is EC2's error envelope (note: not namespaced, RequestID capitalised).
type errorResponse struct {
	XMLName   xml.Name   `xml:"Response"`
	Errors    []xmlError `xml:"Errors>Error"`
	RequestID string     `xml:"RequestID"`
}

type xmlError struct {
	Code    string `xml:"Code"`
	Message string `xml:"Message"`
}

// meta is embedded in every success response.
type meta struct {
	Xmlns     string `xml:"xmlns,attr"`
	RequestID string `xml:"requestId"`
}

func writeXML(w http.ResponseWriter, status int, v any) {
	body, err := xml.Marshal(v)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/xml;charset=UTF-8")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(xml.Header))
	_, _ = w.Write(body)
}

func writeError(w http.ResponseWriter, requestID string, e *APIError) {
	writeXML(w, e.Status, errorResponse{Errors: []xmlError{{Code: e.Code, Message: e.Message}}, RequestID: requestID})
}

// params reads an EC2 Query request: flat lists are "Name.1", "Name.2", ...
type params url.Values

func (p params) get(k string) string { return url.Values(p).Get(k) }

// list returns prefix.1, prefix.2, ... up to the first missing index.
func (p params) list(prefix string) []string {
	var out []string
	for i := 1; i <= 1000; i++ {
		v, ok := p[prefix+"."+strconv.Itoa(i)]
		if !ok || len(v) == 0 {
			break
		}
		out = append(out, v[0])
	}
	return out
}

// indices returns how many prefix.N.* groups the request has (N from 1, contiguous).
func (p params) indices(prefix string) int {
	n := 0
	for i := 1; i <= 1000; i++ {
		pre := prefix + "." + strconv.Itoa(i) + "."
		found := false
		for k := range p {
			if strings.HasPrefix(k, pre) {
				found = true
				break
			}
		}
		if !found {
			break
		}
		n = i
	}
	return n
}

// filters reads Filter.N.Name and Filter.N.Value.M.
func (p params) filters() map[string][]string {
	out := map[string][]string{}
	for i := 1; i <= p.indices("Filter"); i++ {
		pre := "Filter." + strconv.Itoa(i)
		name := p.get(pre + ".Name")
		out[name] = append(out[name], p.list(pre+".Value")...)
	}
	return out
}

// matches reports whether a resource passes every filter: under each filter name, one of the
// values the resource has (have(name)) is among the filter's values.
func matches(filters map[string][]string, have func(name string) []string) bool {
	for name, values := range filters {
		if !slices.ContainsFunc(have(name), func(h string) bool { return slices.Contains(values, h) }) {
			return false
		}
	}
	return true
}

// tagValues is what the filter name ("tag:KEY" or "tag-key") sees of tags; nil for other names.
func tagValues(name string, tags map[string]string) []string {
	if key, ok := strings.CutPrefix(name, "tag:"); ok {
		if v, ok := tags[key]; ok {
			return []string{v}
		}
		return nil
	}
	if name == "tag-key" {
		return sortedKeys(tags)
	}
	return nil
}

// tags reads TagSpecification.N.{ResourceType,Tag.M.Key,Tag.M.Value} for resourceType.
func (p params) tags(resourceType string) (map[string]string, *APIError) {
	out := map[string]string{}
	for i := 1; i <= p.indices("TagSpecification"); i++ {
		pre := "TagSpecification." + strconv.Itoa(i)
		if rt := p.get(pre + ".ResourceType"); rt != resourceType {
			continue
		}
		for j := 1; j <= p.indices(pre+".Tag"); j++ {
			tp := pre + ".Tag." + strconv.Itoa(j)
			k := p.get(tp + ".Key")
			if k == "" {
				return nil, apiErr("InvalidParameterValue", "Tag key must not be empty")
			}
			if strings.HasPrefix(strings.ToLower(k), "aws:") {
				return nil, apiErr("InvalidParameterValue", "Tag keys starting with 'aws:' are reserved for internal use")
			}
			out[k] = p.get(tp + ".Value")
		}
	}
	return out, nil
}

// timestamp formats t as EC2 does.
func timestamp(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z") }

type xmlTag struct {
	Key   string `xml:"key"`
	Value string `xml:"value"`
}

func tagSet(m map[string]string) []xmlTag {
	out := make([]xmlTag, 0, len(m))
	for _, k := range sortedKeys(m) {
		out = append(out, xmlTag{Key: k, Value: m[k]})
	}
	return out
}

type xmlState struct {
	Code int    `xml:"code"`
	Name string `xml:"name"`
}

type xmlStateReason struct {
	Code    string `xml:"code"`
	Message string `xml:"message"`
}

type xmlPlacement struct {
	AvailabilityZone   string `xml:"availabilityZone"`
	AvailabilityZoneID string `xml:"availabilityZoneId"`
	GroupName          string `xml:"groupName"`
	Tenancy            string `xml:"tenancy"`
}

type xmlGroup struct {
	GroupID   string `xml:"groupId"`
	GroupName string `xml:"groupName"`
}

type xmlInstance struct {
	InstanceID            string             `xml:"instanceId"`
	ImageID               string             `xml:"imageId"`
	State                 xmlState           `xml:"instanceState"`
	PrivateDNSName        string             `xml:"privateDnsName"`
	Reason                string             `xml:"reason"`
	AmiLaunchIndex        int                `xml:"amiLaunchIndex"`
	InstanceType          string             `xml:"instanceType"`
	LaunchTime            string             `xml:"launchTime"`
	Placement             xmlPlacement       `xml:"placement"`
	PrivateIPAddress      string             `xml:"privateIpAddress,omitempty"`
	GroupSet              []xmlGroup         `xml:"groupSet>item"`
	StateReason           *xmlStateReason    `xml:"stateReason,omitempty"`
	InstanceLifecycle     string             `xml:"instanceLifecycle,omitempty"`
	SpotInstanceRequestID string             `xml:"spotInstanceRequestId,omitempty"`
	TagSet                []xmlTag           `xml:"tagSet>item"`
	MetadataOptions       xmlMetadataOptions `xml:"metadataOptions"`
	// CapacityReservationID and its specification: the reservation the instance runs in.
	CapacityReservationID            string                               `xml:"capacityReservationId,omitempty"`
	CapacityReservationSpecification *xmlCapacityReservationSpecification `xml:"capacityReservationSpecification,omitempty"`
}

type xmlCapacityReservationSpecification struct {
	Target *xmlCapacityReservationTarget `xml:"capacityReservationTarget,omitempty"`
}

type xmlCapacityReservationTarget struct {
	ID string `xml:"capacityReservationId"`
}

type xmlMetadataOptions struct {
	State                string `xml:"state"`
	HTTPTokens           string `xml:"httpTokens"`
	HopLimit             int    `xml:"httpPutResponseHopLimit"`
	HTTPEndpoint         string `xml:"httpEndpoint"`
	InstanceMetadataTags string `xml:"instanceMetadataTags"`
}

type getConsoleOutputResponse struct {
	XMLName xml.Name `xml:"GetConsoleOutputResponse"`
	meta
	InstanceID string `xml:"instanceId"`
	Timestamp  string `xml:"timestamp"`
	Output     string `xml:"output,omitempty"`
}

type xmlReservation struct {
	ReservationID string        `xml:"reservationId"`
	OwnerID       string        `xml:"ownerId"`
	GroupSet      []xmlGroup    `xml:"groupSet>item"`
	Instances     []xmlInstance `xml:"instancesSet>item"`
}

type runInstancesResponse struct {
	XMLName xml.Name `xml:"RunInstancesResponse"`
	meta
	xmlReservation
}

type describeInstancesResponse struct {
	XMLName xml.Name `xml:"DescribeInstancesResponse"`
	meta
	Reservations []xmlReservation `xml:"reservationSet>item"`
	NextToken    string           `xml:"nextToken,omitempty"`
}

type xmlStateChange struct {
	InstanceID    string   `xml:"instanceId"`
	CurrentState  xmlState `xml:"currentState"`
	PreviousState xmlState `xml:"previousState"`
}

type terminateInstancesResponse struct {
	XMLName xml.Name `xml:"TerminateInstancesResponse"`
	meta
	Instances []xmlStateChange `xml:"instancesSet>item"`
}

type xmlZone struct {
	ZoneName           string `xml:"zoneName"`
	ZoneID             string `xml:"zoneId"`
	ZoneState          string `xml:"zoneState"`
	RegionName         string `xml:"regionName"`
	GroupName          string `xml:"groupName"`
	NetworkBorderGroup string `xml:"networkBorderGroup"`
	OptInStatus        string `xml:"optInStatus"`
	ZoneType           string `xml:"zoneType"`
}

type describeAvailabilityZonesResponse struct {
	XMLName xml.Name `xml:"DescribeAvailabilityZonesResponse"`
	meta
	Zones []xmlZone `xml:"availabilityZoneInfo>item"`
}

type xmlSpotPrice struct {
	AvailabilityZone   string `xml:"availabilityZone"`
	AvailabilityZoneID string `xml:"availabilityZoneId"`
	InstanceType       string `xml:"instanceType"`
	ProductDescription string `xml:"productDescription"`
	SpotPrice          string `xml:"spotPrice"`
	Timestamp          string `xml:"timestamp"`
}

type describeSpotPriceHistoryResponse struct {
	XMLName xml.Name `xml:"DescribeSpotPriceHistoryResponse"`
	meta
	Prices    []xmlSpotPrice `xml:"spotPriceHistorySet>item"`
	NextToken string         `xml:"nextToken"`
}

type createSecurityGroupResponse struct {
	XMLName xml.Name `xml:"CreateSecurityGroupResponse"`
	meta
	Return  bool   `xml:"return"`
	GroupID string `xml:"groupId"`
}

type xmlIPRange struct {
	CidrIP      string `xml:"cidrIp"`
	Description string `xml:"description,omitempty"`
}

type xmlUserIDGroupPair struct {
	GroupID     string `xml:"groupId"`
	UserID      string `xml:"userId"`
	Description string `xml:"description,omitempty"`
}

type xmlIPPermission struct {
	IPProtocol string               `xml:"ipProtocol"`
	FromPort   int                  `xml:"fromPort"`
	ToPort     int                  `xml:"toPort"`
	IPRanges   []xmlIPRange         `xml:"ipRanges>item"`
	Groups     []xmlUserIDGroupPair `xml:"groups>item"`
}

type xmlSecurityGroup struct {
	OwnerID          string            `xml:"ownerId"`
	GroupID          string            `xml:"groupId"`
	GroupName        string            `xml:"groupName"`
	GroupDescription string            `xml:"groupDescription"`
	VpcID            string            `xml:"vpcId"`
	IPPermissions    []xmlIPPermission `xml:"ipPermissions>item"`
	TagSet           []xmlTag          `xml:"tagSet>item"`
}

type describeSecurityGroupsResponse struct {
	XMLName xml.Name `xml:"DescribeSecurityGroupsResponse"`
	meta
	Groups []xmlSecurityGroup `xml:"securityGroupInfo>item"`
}

type returnResponse struct {
	XMLName xml.Name
	meta
	Return bool `xml:"return"`
}

type xmlPlacementGroup struct {
	GroupName string   `xml:"groupName"`
	GroupID   string   `xml:"groupId"`
	Strategy  string   `xml:"strategy"`
	State     string   `xml:"state"`
	TagSet    []xmlTag `xml:"tagSet>item"`
}

type createPlacementGroupResponse struct {
	XMLName xml.Name `xml:"CreatePlacementGroupResponse"`
	meta
	PlacementGroup xmlPlacementGroup `xml:"placementGroup"`
}

type describePlacementGroupsResponse struct {
	XMLName xml.Name `xml:"DescribePlacementGroupsResponse"`
	meta
	Groups []xmlPlacementGroup `xml:"placementGroupSet>item"`
}

type xmlSpotPlacementScore struct {
	Region             string `xml:"region"`
	AvailabilityZoneID string `xml:"availabilityZoneId,omitempty"`
	Score              int    `xml:"score"`
}

type getSpotPlacementScoresResponse struct {
	XMLName xml.Name `xml:"GetSpotPlacementScoresResponse"`
	meta
	Scores []xmlSpotPlacementScore `xml:"spotPlacementScoreSet>item"`
}

func xmlName(local string) xml.Name { return xml.Name{Local: local} }

type xmlSpotStatus struct {
	Code       string `xml:"code"`
	UpdateTime string `xml:"updateTime"`
	Message    string `xml:"message"`
}

type xmlSpotPlacement struct {
	AvailabilityZone string `xml:"availabilityZone"`
	GroupName        string `xml:"groupName,omitempty"`
	Tenancy          string `xml:"tenancy"`
}

type xmlLaunchSpecification struct {
	ImageID      string           `xml:"imageId"`
	InstanceType string           `xml:"instanceType"`
	Placement    xmlSpotPlacement `xml:"placement"`
	GroupSet     []xmlGroup       `xml:"groupSet>item"`
}

type xmlSpotInstanceRequest struct {
	SpotInstanceRequestID        string                 `xml:"spotInstanceRequestId"`
	SpotPrice                    string                 `xml:"spotPrice,omitempty"`
	Type                         string                 `xml:"type"`
	State                        string                 `xml:"state"`
	Status                       xmlSpotStatus          `xml:"status"`
	LaunchSpecification          xmlLaunchSpecification `xml:"launchSpecification"`
	InstanceID                   string                 `xml:"instanceId"`
	CreateTime                   string                 `xml:"createTime"`
	ProductDescription           string                 `xml:"productDescription"`
	TagSet                       []xmlTag               `xml:"tagSet>item"`
	LaunchedAvailabilityZone     string                 `xml:"launchedAvailabilityZone"`
	LaunchedAvailabilityZoneID   string                 `xml:"launchedAvailabilityZoneId"`
	InstanceInterruptionBehavior string                 `xml:"instanceInterruptionBehavior"`
}

type describeSpotInstanceRequestsResponse struct {
	XMLName xml.Name `xml:"DescribeSpotInstanceRequestsResponse"`
	meta
	Requests  []xmlSpotInstanceRequest `xml:"spotInstanceRequestSet>item"`
	NextToken string                   `xml:"nextToken,omitempty"`
}
