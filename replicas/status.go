package replicas

import "go.uber.org/zap"

// Service statuses (SkyServe's names), as `serve status` shows them.
const (
	ServiceControllerInit = "CONTROLLER_INIT"
	ServiceReplicaInit    = "REPLICA_INIT"
	ServiceReady          = "READY"
	ServiceNoReplica      = "NO_REPLICA"
	ServiceShuttingDown   = "SHUTTING_DOWN"
	ServiceFailed         = "FAILED"
	ServiceFailedCleanup  = "FAILED_CLEANUP"
)

// ServiceStatus is the service's status by SkyServe's rules: SHUTTING_DOWN while shuttingDown
// (the caller drains the endpoint before it calls Shutdown), READY with any READY replica,
// REPLICA_INIT until the first one, NO_REPLICA once none is left or none is wanted.
func (m *Manager) ServiceStatus(shuttingDown bool) string {
	if err := m.load(); err != nil {
		m.log.Warn("load replica records", zap.Error(err))
	}
	s := m.snap.Load()
	ready, starting := 0, false
	for _, rec := range s.records {
		switch {
		case rec.Status == StatusReady:
			ready++
		case !rec.Status.Terminal():
			starting = true
		}
	}
	switch {
	case shuttingDown:
		return ServiceShuttingDown
	case ready > 0:
		m.everReady.Store(true)
		return ServiceReady
	case s.desired == 0 || m.everReady.Load():
		return ServiceNoReplica
	case starting:
		return ServiceReplicaInit
	case len(s.records) == 0:
		return ServiceControllerInit
	}
	return ServiceReplicaInit
}
