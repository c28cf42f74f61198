package kubernetes

import "testing"

func TestCanonicalGPU(t *testing.T) {
	for in, want := range map[string]string{
		"NVIDIA-A100-SXM4-40GB":     "A100",
		"NVIDIA-A100-SXM4-80GB":     "A100-80GB",
		"NVIDIA-A100-80GB-PCIe":     "A100-80GB",
		"nvidia-tesla-a100":         "A100",
		"nvidia-a100-80gb":          "A100-80GB",
		"NVIDIA-H100-80GB-HBM3":     "H100",
		"nvidia-h100-mega-80gb":     "H100-MEGA",
		"NVIDIA-L4":                 "L4",
		"nvidia-l4":                 "L4",
		"Tesla-T4":                  "T4",
		"nvidia-tesla-t4":           "T4",
		"NVIDIA-A10G":               "A10G",
		"NVIDIA-L40S":               "L40S",
		"Tesla-V100-SXM2-16GB":      "V100",
		"Tesla-V100-SXM2-32GB":      "V100-32GB",
		"NVIDIA-H200":               "H200",
		"NVIDIA-GeForce-RTX-4090":   "",
		"":                          "",
		"nvidia-tesla-p100":         "P100",
		"NVIDIA_A100_SXM4_40GB":     "A100",
		"NVIDIA A100-SXM4-40GB":     "A100",
		"NVIDIA-H100-NVL":           "H100",
		"NVIDIA-B200":               "B200",
		"nvidia-tesla-v100":         "V100",
		"NVIDIA-A100-PCIE-40GB-MIG": "A100",
	} {
		if got := canonicalGPU(in); got != want {
			t.Errorf("canonicalGPU(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestPodName(t *testing.T) {
	for in, prefix := range map[string]string{
		"chat-3":          "chat-3-",
		"Chat_Model.v2-1": "chat-model-v2-1-",
	} {
		got, err := podName(in)
		if err != nil || len(got) != len(prefix)+5 || got[:len(prefix)] != prefix {
			t.Errorf("podName(%q) = %q, %v; want %q + 5 random characters", in, got, err, prefix)
		}
	}
	if _, err := podName("---"); err == nil {
		t.Error("podName(---): want an error")
	}
	long, err := podName("a-very-long-service-name-that-goes-on-and-on-and-on-forever-123")
	if err != nil || len(long) > 63 {
		t.Errorf("long name: %q (%d characters), %v; want at most 63", long, len(long), err)
	}
}
