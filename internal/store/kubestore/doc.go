// Package kubestore keeps the controller's state (store.Store) as objects in a Kubernetes API
// server, so that a second controller can take over from a dead one with nothing on a local disk.
//
// # Records are labelled ConfigMaps, their secrets sealed
//
// Every record is one ConfigMap labelled app.kubernetes.io/managed-by=ferry and ferry.dev/kind:
//
//	ferry-state             the job id counter
//	ferry-svc-NAME          a service: its row, its rollout and every version (one key each)
//	ferry-rep-NAME-ID       a replica
//	ferry-job-ID            a job
//	ferry-left-HASH         a leftover to stop (launcher.Leftover), named by a hash of its key
//	ferry-tenants           the tenants' directory: API key hashes, teams, prices (tenants.go)
//	ferry-usage-DAY-SHARD   the usage rows of one UTC day, for the keys of one shard (tenants.go)
//
// The tasks in them are Task.Redacted(); the full tasks (secrets, envs named like a credential,
// API key hashes, probe credentials) are in a ConfigMap beside the record's, NAME.sealed (kind
// sealed), each value encrypted (AES-256-GCM) under the state key, which is the one Secret the
// store uses: ferry-state-key, read by name (sealed.go). So RBAC can give "read the state"
// without "read the keys", and the controller itself needs no list or watch on Secrets, which
// RBAC could not narrow to Ferry's: its Role gets the key by resourceNames. Stores written
// before kept the full tasks in a Secret per record; Open moves them (see sealed.go).
//
// Why ConfigMaps and not custom resources with status subresources: the fence. Every write must
// carry the leader's term where the API server can check it (the ValidatingAdmissionPolicy in
// charts/ferry/templates/fencing-policy.yaml compares the ferry.dev/term and ferry.dev/holder
// annotations with the Lease, on the objects labelled ferry.dev/kind: the store's, not the
// launcher's per-pod Secrets). A write to a /status subresource cannot carry it: the API server
// resets metadata to the stored object's (a status write's annotations are dropped), so one
// policy over annotations cannot fence status writes, and the fence would have to be repeated
// inside every kind's status. Records are therefore written whole, in one object each where
// SQLite used one transaction (a version, the rollout to it and the current version change in
// one write of the service's ConfigMap), which leaves a status subresource with nothing to do. ConfigMaps then need no
// per-kind CRD to install and upgrade, and come with typed informers. Every record is far below
// the 1 MiB object limit except, in time, a service's: it keeps every version (a few kilobytes
// of task each), as SQLite does, so hundreds of updates fit; pruning versions no replica runs is
// not done yet, and a write past the limit fails with the API server's error. What they lack,
// kubectl get columns, the user-facing FerryService custom resource gives: it has a status
// subresource, written by the controller, and is what people look at.
//
// # Concurrency
//
// Reads come from an informer cache (one watch on the namespace's Ferry ConfigMaps), so status
// reads and the replica manager's lists cost no request. Every
// read-modify-write (counters, a service's row, rollout and versions, a replica's record) sends
// the resourceVersion it read; a conflict re-reads from the API server and retries, after a
// jittered exponential pause, a bounded number of times. "Not found" is the API server's word,
// never a lagging cache's: an object the other controller created a moment ago may not be in
// this one's cache yet. What the store writes, or reads fresh, is laid over the cache until the
// watch delivers it (written.go), so a caller reads its own writes at once, without waiting
// for the watch, which trails writes by seconds on a busy API server.
//
// A delete marks the object first (ferry.dev/deleting, with the fence) by a merge patch, which
// cannot conflict, then deletes it on the condition that it is still as marked. From the mark
// on, writers leave the object alone, so a delete is neither refused nor starved because the
// status loop or the other controller's last writes before a failover keep changing it (issue
// 42); should someone else change it, the delete reads, marks and tries again. A delete of what
// is gone is success. DeleteService marks the service before it lists (from the API server) the
// replicas to delete, and no replica record is created for a marked service, so no record
// outlives its service.
//
// The replica id counter is in the service's ConfigMap and the job id counter in ferry-state: an
// id is handed out only by an update that succeeded against the resourceVersion it read, or by
// the create of the service, which reserves its initial replicas' ids for the creating store
// (ids.go), so two controllers can never both hand out the same id.
//
// # Fencing
//
// Options.Fence says whether this controller leads and with which term; when it does not, every
// write is refused here (ErrNotLeader), and a write already in flight when leadership was lost is
// refused by the API server. Deletes cannot carry annotations, so a delete first marks the
// object (a fenced patch) and then deletes it with that patch's resourceVersion as
// precondition.
//
// At open, a store with leader election asks the API server, by a dry run, whether the fencing
// policy is in force (probeFence). While it is and the store leads in the term it opened in, no
// other controller's write can land beside its own, so it trusts its own view where it would
// otherwise read the API server again (trustsOwnView: after a replica record's create).
package kubestore
