package provision

import (
	"context"
	"testing"
	"time"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/optimizer"
)

// Through the real optimizer, a task without infra launches where it fits (issue 25): a T4
// task on AWS, not on a local machine without GPUs; a small CPU task on local; and a scoped
// provisioner for such a task keeps local.
func TestLaunchWithoutInfraOptimisesOverEveryInfra(t *testing.T) {
	provs := map[string]*scripted{}
	var infras []Infra
	for _, name := range []string{"aws", configs.InfraLocal} {
		provs[name] = &scripted{infra: name}
		infras = append(infras, Infra{Name: name, Provider: provs[name]})
	}
	planned := []optimizer.Infra{
		{Name: "aws", Kind: optimizer.Cloud},
		{Name: configs.InfraLocal, Kind: optimizer.Local, Offerings: optimizer.LocalOfferings(2, 8, nil)},
	}
	p, err := New(Options{Infras: infras, BlockFor: time.Minute,
		Planner: PlannerFunc(func(_ context.Context, r configs.Resources) ([]launcher.Placement, error) {
			cands, err := optimizer.Plan(r, planned)
			out := make([]launcher.Placement, len(cands))
			for i, c := range cands {
				out[i] = c.Placement
			}
			return out, err
		})})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	gpu := configs.Resources{Accelerators: []configs.Accelerator{{Name: "T4", Count: 1}}}
	inst, err := p.Scope(gpu).Launch(ctx, launcher.Spec{Name: "gpu-1", Resources: gpu})
	if err != nil {
		t.Fatalf("T4 launch: %v", err)
	}
	if inst.Infra != "aws" || len(provs[configs.InfraLocal].tries) != 0 {
		t.Errorf("T4 task went to %s (local tried %d times): want aws", inst.Infra, len(provs[configs.InfraLocal].tries))
	}
	if got := provs["aws"].tries[0]; got.InstanceType != "g4dn.xlarge" || got.PricePerHour <= 0 {
		t.Errorf("aws placement %+v: want the cheapest T4 type, priced", got)
	}
	cpu := configs.Resources{CPUs: "2"}
	inst, err = p.Scope(cpu).Launch(ctx, launcher.Spec{Name: "cpu-1", Resources: cpu})
	if err != nil || inst.Infra != configs.InfraLocal {
		t.Errorf("cpus=2 launch: %+v, %v; want local", inst, err)
	}
	big := configs.Resources{CPUs: "4"}
	inst, err = p.Scope(big).Launch(ctx, launcher.Spec{Name: "cpu-2", Resources: big})
	if err != nil || inst.Infra != "aws" || provs["aws"].tries[1].InstanceType != "c6i.xlarge" {
		t.Errorf("cpus=4 launch: %+v, %v; want aws c6i.xlarge (local has 2 vCPUs)", inst, err)
	}
}
