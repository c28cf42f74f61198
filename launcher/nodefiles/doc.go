// Package nodefiles is what a node receives before its program starts, the same on every
// infra: the script it runs (RenderScript: the gang's addresses, a git workdir cloned in place,
// setup, run), and the task's workdir and file_mounts, checked (SpecFiles), copied into a local
// instance's directories (SyncFilesLocal), packed for a pod (PackLocal) or carried in a VM's
// boot script (FilesShell), with its buckets mounted by FUSE (MountScript).
//
// Every provider uses it and the launcher root, which is only the contract between providers
// and their callers, does not: how a file reaches a node is no business of a caller's.
package nodefiles
