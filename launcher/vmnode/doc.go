// Package vmnode is what the VM clouds (launcher/aws, launcher/gcp) share for a node: its
// boot script around the task (Boot: the files, a docker image; JobBoot: the job's checkpoint
// directory, the cloud's preemption watch, the exit marker and poweroff), and what its console
// tells afterwards (ExitCodes, read from the marker; StreamPolledLog, following a console that
// can only be polled).
//
// Only the VM clouds and their fakes import it: a pod or a local process never boots.
package vmnode
