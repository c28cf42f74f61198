package sim

import (
	"errors"
	"fmt"
	"time"
)

// Model is how one replica serves: an NVIDIA V100 16 GB (AWS p3.2xlarge) running a ~7B fp16
// model (Mistral-7B's shape: 7.2B parameters, 32 layers, grouped-query attention with 8 KV heads
// of 128) on a vLLM-like engine with continuous batching and no chunked prefill. The constants
// are estimates from the hardware's published figures, not measurements; DefaultModel says how
// each was reached.
type Model struct {
	// ColdStart is launch to READY: VM provisioning, image pull, engine start and weight load.
	ColdStart time.Duration
	// MaxSeqs is the most sequences decoding at once (vLLM's max_num_seqs).
	MaxSeqs int
	// KVCapacityTokens is how many tokens the KV cache holds; it is also the longest request
	// (prompt plus output) the engine serves, as vLLM needs max_model_len to fit in the cache.
	KVCapacityTokens int
	// MaxBatchedTokens bounds the prompt tokens of one prefill step (max_num_batched_tokens).
	MaxBatchedTokens int
	// A prefill step over T prompt tokens takes PrefillBase + T × PrefillPerToken; decoding is
	// stalled meanwhile (vLLM schedules prefills first and does not mix them with decodes).
	PrefillBase, PrefillPerToken time.Duration
	// A decode step, which gives every running sequence one token, takes DecodeBase +
	// DecodePerSeq × sequences + DecodePerKVToken × tokens held in the KV cache.
	DecodeBase, DecodePerSeq, DecodePerKVToken time.Duration
}

// DefaultModel is a V100 16 GB serving a ~7B model in fp16:
//
//   - ColdStart 4 min: AWS GPU VMs, spot or on-demand, take about 1–2 min to boot; pulling a
//     vLLM image and reading 14.5 GB of weights from object storage take 2–3 more. The issue
//     puts both kinds at 3–5 min; 4 is the middle. --cold-start changes it.
//   - KVCapacityTokens 8,192: 16 GiB × 0.95 (gpu_memory_utilization) = 15.2 GiB, less 13.5 GiB
//     of weights and ~0.6 GiB of activations and CUDA context, leaves ~1.1 GiB; at 128 KiB per
//     token (2 × 32 layers × 8 KV heads × 128 × 2 bytes) that is ~8,800 tokens, rounded down to
//     512 blocks of 16. A model without grouped-query attention (512 KiB per token) would hold
//     only ~2,000 and could not serve the trace's longer prompts at all.
//   - MaxSeqs 256: vLLM's default max_num_seqs. On this GPU the KV cache binds first (the
//     conversation trace's mean request is 1,155 prompt + 211 output tokens, so ~6 fit).
//   - MaxBatchedTokens 8,192: vLLM's default without chunked prefill, max(max_model_len, 2048).
//   - PrefillPerToken 0.25 ms (4,000 tokens/s): 2 × 7.2 G = 14.5 GFLOP per token at ~58 TFLOPS,
//     46% of the V100 SXM2's 125 TFLOPS fp16 tensor-core peak (Volta has no FlashAttention-2,
//     so attention runs on xformers kernels). PrefillBase 20 ms is one step's fixed cost.
//   - DecodeBase 24 ms: every decode step reads all 14.5 GB of weights; at ~600 GB/s, two thirds
//     of the 900 GB/s HBM2 peak, that is 24 ms (about 40 tokens/s for a single stream).
//   - DecodePerKVToken 0.22 µs: each step also reads the KV cache, 128 KiB per held token at
//     the same 600 GB/s; a full cache adds 1.8 ms.
//   - DecodePerSeq 0.5 ms: per-sequence work outside the weight read (sampling, the v0
//     scheduler's Python bookkeeping, the batch's growing GEMM width).
//
// So at the trace's typical batch of 6 sequences and 8k cached tokens a token takes ~29 ms,
// and a replica finishes roughly 0.7–1 request/s of the trace.
func DefaultModel() Model {
	return Model{
		ColdStart:        4 * time.Minute,
		MaxSeqs:          256,
		KVCapacityTokens: 8192,
		MaxBatchedTokens: 8192,
		PrefillBase:      20 * time.Millisecond,
		PrefillPerToken:  250 * time.Microsecond,
		DecodeBase:       24 * time.Millisecond,
		DecodePerSeq:     500 * time.Microsecond,
		DecodePerKVToken: 220 * time.Nanosecond,
	}
}

// Validate names every field out of range.
func (m Model) Validate() error {
	var errs []error
	if m.ColdStart < 0 {
		errs = append(errs, fmt.Errorf("cold start %v: must not be negative", m.ColdStart))
	}
	if m.MaxSeqs < 1 {
		errs = append(errs, fmt.Errorf("max sequences %d: must be at least 1", m.MaxSeqs))
	}
	if m.KVCapacityTokens < 2 {
		errs = append(errs, fmt.Errorf("KV capacity %d tokens: must be at least 2", m.KVCapacityTokens))
	}
	if m.MaxBatchedTokens < 1 {
		errs = append(errs, fmt.Errorf("max batched tokens %d: must be at least 1", m.MaxBatchedTokens))
	}
	if m.PrefillBase < 0 || m.PrefillPerToken < 0 || m.DecodePerSeq < 0 || m.DecodePerKVToken < 0 {
		errs = append(errs, errors.New("prefill and decode times must not be negative"))
	}
	if m.DecodeBase <= 0 {
		errs = append(errs, fmt.Errorf("decode base %v: must be positive", m.DecodeBase))
	}
	return errors.Join(errs...)
}

// PrefillTime is one prefill step over tokens prompt tokens, in seconds.
func (m Model) PrefillTime(tokens int) float64 {
	return m.PrefillBase.Seconds() + float64(tokens)*m.PrefillPerToken.Seconds()
}

// DecodeStep is one decode step's time in seconds with seqs sequences holding kvTokens.
func (m Model) DecodeStep(seqs int, kvTokens float64) float64 {
	return m.DecodeBase.Seconds() + float64(seqs)*m.DecodePerSeq.Seconds() + kvTokens*m.DecodePerKVToken.Seconds()
}
