package replicasim

import (
	"encoding/json"
	"strconv"
)

// Prefill/decode disaggregation as vLLM's NixlConnector runs it (Config.KVTransfer): a router
// sends the request to a prefill replica with kv_transfer_params {"do_remote_decode": true} and
// max_tokens 1; the answer carries kv_transfer_params naming the prefill engine and the KV's
// blocks; the router sends the request on to a decode replica with those params
// ("do_remote_prefill": true), which pulls the KV instead of computing it and generates the
// answer. The simulator moves no KV: the decode side checks that the params name an engine and
// charges KVTransferPerToken per prompt token in place of the prefill.

// kvTransferParams is the part of vLLM's kv_transfer_params the flow reads.
type kvTransferParams struct {
	DoRemoteDecode  bool     `json:"do_remote_decode"`
	DoRemotePrefill bool     `json:"do_remote_prefill"`
	RemoteEngineID  string   `json:"remote_engine_id"`
	RemoteBlockIDs  []uint64 `json:"remote_block_ids"`
	RemoteHost      string   `json:"remote_host"`
	RemotePort      int      `json:"remote_port"`
}

// prefillChunkTokens is the prompt tokens one engine step prefills (vLLM's chunked prefill
// budget, max_num_batched_tokens): what one step can stall the batch's decodes for.
const prefillChunkTokens = 2048

// kvRole is what a request asks of this replica in the disaggregated flow.
type kvRole uint8

const (
	kvCombined      kvRole = iota // prefill and decode here
	kvPrefillOnly                 // do_remote_decode: prefill, answer one token and the params
	kvRemotePrefill               // do_remote_prefill: pull the KV, then decode
)

// role reads the request's kv_transfer_params; a replica without KVTransfer ignores them, as
// vLLM without a KV connector does. It answers a do_remote_prefill without an engine to pull
// from with a 400.
func (s *Server) role(req *completionRequest) (kvRole, *apiError) {
	p := req.KVTransferParams
	if !s.cfg.KVTransfer || p == nil {
		return kvCombined, nil
	}
	switch {
	case p.DoRemotePrefill && p.RemoteEngineID == "":
		return kvCombined, badRequest("kv_transfer_params.do_remote_prefill needs remote_engine_id (the prefill replica's answer carries it)")
	case p.DoRemotePrefill:
		return kvRemotePrefill, nil
	case p.DoRemoteDecode:
		return kvPrefillOnly, nil
	}
	return kvCombined, nil
}

// appendKVTransferParams appends a prefill answer's kv_transfer_params member, with a leading
// comma: what the decode replica needs to pull this prompt's KV.
func (s *Server) appendKVTransferParams(dst []byte, promptTokens int) []byte {
	blocks := (promptTokens + blockTokens - 1) / blockTokens
	dst = append(dst, `,"kv_transfer_params":{"do_remote_prefill":true,"do_remote_decode":false,"remote_engine_id":`...)
	dst = append(dst, s.engineIDJSON...)
	dst = append(dst, `,"remote_block_ids":[`...)
	for i := range min(blocks, 4096) {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = strconv.AppendInt(dst, int64(i), 10)
	}
	dst = append(dst, `],"remote_host":`...)
	host, _ := json.Marshal(s.cfg.Host)
	dst = append(dst, host...)
	dst = append(dst, `,"remote_port":`...)
	dst = strconv.AppendInt(dst, int64(s.cfg.Port), 10)
	return append(dst, `,"tp_size":1}`...)
}
