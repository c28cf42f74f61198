// Package attach is the protocol between the controller and standalone proxies that follow one
// of its services (`ferry proxy --attach SERVICE`) or all of them in one gateway (`ferry proxy
// --attach-all`), so that several proxies can sit behind one load balancer and still serve,
// drain and scale like the controller's own proxy. It holds both ends: the controller's Hub and
// the Routes that serve it, and the proxy's Follower and GatewayFollower (services.go has the
// list of services the latter follows).
//
// Two routes of the controller API carry it, behind the attach token (proxy.token in
// FERRY_HOME, rpc.ScopeAttach), which may call these two and nothing else, or the controller
// token:
//
//	GET  /v1/services/{name}/replicaset?after=SEQ&wait=SECONDS  long poll for the READY set
//	POST /v1/services/{name}/proxyload                         the proxy's load, every 500 ms
//
// A long poll, not a periodic fetch: it answers at once when the service's set is not the one
// the proxy has (Seq differs from after), and otherwise when it changes or after wait seconds,
// so a proxy hears of a new set within a round trip while an idle one costs a request every
// half minute. The set carries the service's proxy configuration (ProxyConfig: policy, API
// keys, limits), and a change of it moves Seq too, so one number says whether a proxy is
// current. Seqs start from the wall clock, so a restarted controller's are above any its
// predecessor handed out and a proxy still on the old set is seen to lag.
//
// The load reports close the loop. A replica leaving the set is stopped only once no proxy
// has requests on it and every proxy that reported lately serves the current Seq (until then
// it may still send it new requests); requests in flight and waiting at the proxies, and
// their arrivals, count as the service's load for the autoscaler. A proxy silent for a few
// seconds is taken as gone, so a dead proxy never holds a drain for long.
//
// The controller is not in the request path: a Follower keeps serving the last set it had
// while the controller is away, and finds a restarted one through FERRY_HOME (its socket on
// this machine, its TCP address from another, pinned to controller.crt when it serves TLS),
// within about a second.
package attach
