package configs

import (
	"regexp"
	"strings"
)

// SkyPilot task fields Ferry does not act on. Writing one is an error (Ferry never ignores a
// field silently), and the error says what to write instead: these replace the generic
// "unknown field" message for a name SkyPilot users will write.
var skypilotUnsupported = map[string]string{
	"event_callback":    "Ferry runs no event callbacks: follow `ferry serve status --json` or `ferry jobs queue` instead, and remove event_callback",
	"volumes":           "Ferry does not create SkyPilot volumes: use file_mounts for files and buckets (a job's checkpoints go to $FERRY_CHECKPOINT_DIR), and remove volumes",
	"volume_mounts":     "Ferry does not create SkyPilot volumes: use file_mounts for files and buckets, and remove volume_mounts",
	"experimental":      "per-task SkyPilot config overrides are not read: Kubernetes and cloud settings go in Ferry's config.yaml; remove experimental",
	"inputs":            "experimental in SkyPilot and not read by Ferry: remove inputs",
	"outputs":           "experimental in SkyPilot and not read by Ferry: remove outputs",
	"pool":              "Ferry has no worker pools: serve with service:, or run jobs (ferry jobs launch); remove pool",
	"managed_secrets":   "Ferry has no secret store: write secrets: {NAME: null} and pass --secret NAME",
	"api_server_access": "Ferry has no API server for tasks to reach: remove api_server_access",

	"resources.ephemeral_storage": "not supported: size the disk with disk_size",
	"resources.local_disk":        "not supported: pin an instance_type that has local NVMe disks",
	"resources.max_hourly_cost":   "not supported: --dry-run prints every candidate with its price; narrow with infra or instance_type",
	"resources.accelerator_args":  "Ferry does not launch TPUs, which is what accelerator_args configures: remove it",
	"resources.container_image":   "write image_id: docker:IMAGE",
	"resources.priority":          "a job's priority is job.priority in Ferry (0-10000; services stand at 1000)",
	"resources.priority_class":    "Ferry sets the pod's priority from job.priority: remove priority_class",
	"resources.volumes":           "Ferry does not create SkyPilot volumes: use file_mounts, and remove volumes",
}

// indexRE strips list indexes and alternatives from a field path, so that every resources
// mapping (top level, any_of[i], ordered[i]) shares one entry.
var indexRE = regexp.MustCompile(`\[[0-9]+\]|\.(any_of|ordered)`)

// unsupportedReason is what to write instead of a SkyPilot field Ferry does not support, or "".
func unsupportedReason(field, key string) string {
	if strings.HasPrefix(key, "_") {
		return "SkyPilot's internal fields are not part of a task file: remove " + key
	}
	return skypilotUnsupported[joinField(indexRE.ReplaceAllString(field, ""), key)]
}
