package main

import (
	"fmt"

	"github.com/spf13/cobra"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	chart "github.com/ferryserve/ferry/charts/ferry"
)

// `ferry crd` exists because Helm creates a chart's crds/ on install and never upgrades them: a
// new FerryService field would be pruned by the old schema. The CRD is cluster-wide and shared
// by every release, so no one release can own it as a template; the binary carries the CRD of
// its own version instead, and whoever upgrades applies it once.
func init() {
	register(func() *cobra.Command {
		cmd := &cobra.Command{
			Use:   "crd",
			Short: "Install or upgrade the FerryService CRD on a Kubernetes cluster",
			Long: `The FerryService CustomResourceDefinition, as this ferry binary was built with it.

helm install creates it from the chart's crds/ but helm upgrade never updates it: run
'ferry crd apply' with the new version's binary before 'helm upgrade'. It needs the right to
create and patch customresourcedefinitions (a cluster admin's), not the controller's.`,
			Example: "  ferry crd apply\n  ferry crd apply --kubeconfig ~/.kube/prod --kube-context admin\n  ferry crd print | kubectl apply --server-side --force-conflicts -f -",
		}
		var kubeconfig, kubeContext string
		apply := &cobra.Command{
			Use:   "apply",
			Short: "Create or update the CRD in place (server-side apply), and wait until it is served",
			Example: "  ferry crd apply                 # before helm upgrade, with the new version's ferry\n" +
				"  ferry crd apply --kubeconfig ~/.kube/prod --kube-context admin",
			Args: cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				rules := clientcmd.NewDefaultClientConfigLoadingRules()
				rules.ExplicitPath = kubeconfig
				cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: kubeContext}).ClientConfig()
				if err != nil {
					return fmt.Errorf("kubernetes configuration: %w", err)
				}
				dyn, err := dynamic.NewForConfig(cfg)
				if err != nil {
					return err
				}
				applied, err := chart.ApplyCRDs(cmd.Context(), dyn)
				for _, a := range applied {
					fmt.Fprintln(cmd.OutOrStdout(), a)
				}
				return err
			},
		}
		apply.Flags().StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig (default: $KUBECONFIG, ~/.kube/config, else in-cluster)")
		apply.Flags().StringVar(&kubeContext, "kube-context", "", "context of the kubeconfig (default: its current context)")
		printCmd := &cobra.Command{
			Use:     "print",
			Short:   "Print the CRD as YAML, for kubectl or a GitOps repository",
			Example: "  ferry crd print | kubectl apply --server-side --force-conflicts -f -\n  ferry crd print > gitops/ferry-crd.yaml",
			Args:    cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				crds, err := chart.CRDs()
				if err != nil {
					return err
				}
				for _, crd := range crds {
					out, err := yaml.Marshal(crd.Object)
					if err != nil {
						return err
					}
					fmt.Fprintf(cmd.OutOrStdout(), "---\n%s", out)
				}
				return nil
			},
		}
		cmd.AddCommand(apply, printCmd)
		return cmd
	})
}
