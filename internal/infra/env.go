package infra

import "strings"

// credentialPrefixes and credentialNames are the environment variables the infras' SDKs read
// for credentials, profiles, regions and endpoints: the AWS SDK's AWS_* (keys, session token,
// profile, config and credentials files, web identity, IMDS and container endpoints), Google's
// Application Default Credentials and metadata server (GOOGLE_*, CLOUDSDK_CONFIG, GCE_METADATA_*,
// NO_GCE_CHECK), and client-go's kubeconfig and in-cluster settings. Kubeconfig exec plugins
// (aws eks get-token, gke-gcloud-auth-plugin) read the same.
var (
	credentialPrefixes = []string{"AWS_", "GOOGLE_", "GCE_METADATA_"}
	credentialNames    = []string{"KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT", "CLOUDSDK_CONFIG", "NO_GCE_CHECK"}
)

// CredentialEnv reports whether name is an environment variable an infra reads to reach its
// cloud or cluster: a controller started for the CLI keeps these of the CLI's environment and
// nothing else of the kind. Local replicas never get them (launcher/local.BaseEnv).
func CredentialEnv(name string) bool {
	for _, p := range credentialPrefixes {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	for _, n := range credentialNames {
		if name == n {
			return true
		}
	}
	return false
}
